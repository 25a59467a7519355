import sys

from muestra.cli.main import main

sys.exit(main())
