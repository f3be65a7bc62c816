import sys

from neuron_dra.driver.entry import main

sys.exit(main())
