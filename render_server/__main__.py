import sys

from render_server.cli.main import main

sys.exit(main())
