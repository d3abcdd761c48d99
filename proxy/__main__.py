import sys

from proxy.tools.cli import main

sys.exit(main())
