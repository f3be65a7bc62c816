import sys

from neuron_dra.driver.daemon.main import main

sys.exit(main())
