import sys

from funnel_core.cli import main

sys.exit(main())
