import sys

from neuron_dra.driver.main import main

sys.exit(main())
