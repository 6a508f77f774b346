import sys

from roller.cli.main import main

sys.exit(main())
