import sys

from metering_agent.cli import main

sys.exit(main())
