"""The reference served over kvcert-stdio/1, writing every line it reads and writes to the
transcript file named by argv[1] (prefixed "> " for messages and "< " for replies), so tests
can validate both directions against schema/stdio.schema.json."""

from __future__ import annotations

import json
import sys

from kvcert.conformance.contract.stdio import answer
from kvcert.conformance.engines.reference_engine import ReferenceEngine


def main() -> None:
    engine = ReferenceEngine()
    with open(sys.argv[1], "a", encoding="utf-8") as transcript:
        for line in sys.stdin:
            transcript.write("> " + line.strip() + "\n")
            reply = answer(engine, line)
            if reply is None:
                return
            text = json.dumps(reply)
            transcript.write("< " + text + "\n")
            print(text, flush=True)


if __name__ == "__main__":
    main()
