#!/usr/bin/env python3
"""Print libemm's version, read from include/emm/emm_version.h (the one source)."""
import os
import re

here = os.path.dirname(os.path.abspath(__file__))
text = open(os.path.join(here, '..', 'include', 'emm', 'emm_version.h')).read()
parts = [re.search(r'#define EMM_VERSION_%s\s+(\d+)' % k, text).group(1) for k in ('MAJOR', 'MINOR', 'PATCH')]
print('.'.join(parts))
