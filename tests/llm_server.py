"""The scripted OpenAI-compatible server moved to `lib/scripted_llm.py` (the demo's scripted judge
runs on it too). This module *is* that one (aliased, not copied), so existing imports keep working;
new code imports `lib.scripted_llm`."""

import sys

from lib import scripted_llm

sys.modules[__name__] = scripted_llm
