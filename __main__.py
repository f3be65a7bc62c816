"""The default stack program (Pulumi.yaml): `pulumi up` runs this file.

Everything lives in `neuron_dra.components.stack` so that `neuron-dra plan` runs the very same program
offline, and other stacks can import the components instead.
"""

from neuron_dra.components.stack import run_program

run_program()
