import sys

from neuron_dra.cli import main

sys.exit(main())
