"""A kvcert-stdio/1 engine that misbehaves on purpose: it hangs on one case, exits on
another, answers garbage on a third, and is the reference otherwise."""

from __future__ import annotations

import json
import sys
import time

from kvcert.conformance.engines.reference_engine import ReferenceEngine

HANG, EXIT, GARBAGE = (
    "hit.vllm-c1.eagle-drop-once",
    "hit.vllm-c2.eagle-drop-once",
    "hit.vllm-c3.eagle-drop-once",
)


def main() -> None:
    engine = ReferenceEngine()
    for line in sys.stdin:
        message = json.loads(line)
        if message["cmd"] == "stop":
            return
        if message["cmd"] == "start":
            reply = {"protocol": "kvcert-stdio/1", "engine": engine.describe()}
        else:
            case = message["case"]
            marker = json.dumps(case["layout"], sort_keys=True)
            if marker == sys.argv[1]:
                time.sleep(60)
            if marker == sys.argv[2]:
                sys.exit(3)
            if marker == sys.argv[3]:
                print("this is not json", flush=True)
                continue
            reply = {"seq": message["seq"], "result": engine.run(case)}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
