import sys

from gpufleet.cli import main

sys.exit(main())
