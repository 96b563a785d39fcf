"""Server tests borrow the engine tests' scripted mock model (tests/engine/engine_helpers.py), so that a reply
can be fixed in advance (tool calls) without a trained model."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
