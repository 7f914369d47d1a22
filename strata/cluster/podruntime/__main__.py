import sys

from strata.cluster.podruntime.main import main

sys.exit(main(sys.argv[1:]))
