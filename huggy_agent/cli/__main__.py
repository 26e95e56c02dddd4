import sys

from huggy_agent.cli import main

sys.exit(main())
