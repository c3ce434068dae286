import sys

from kvcert.conformance.sglang.campaign.command import main

sys.exit(main())
