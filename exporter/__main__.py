import sys

from gpu_triage.exporter.cli.main import main

sys.exit(main())
