"""minato's logger: one name, ``minato``, for users to configure."""

import logging

logger = logging.getLogger("minato")
