"""`python -m envs.standin --mlagents-port N ...`: run the stand-in as a Unity player would run."""

import sys

from envs.standin.client import main

sys.exit(main())
