import sys

from neuron_dra.driver.groups.main import main

sys.exit(main())
