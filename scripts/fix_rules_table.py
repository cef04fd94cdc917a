"""Print the fix-rule table (docs/fix-rules.md) from kvreport.fixes.RULES.

    python scripts/fix_rules_table.py > docs/fix-rules.md
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "collector")]

from kvreport.fixes import rules_markdown  # noqa: E402

if __name__ == "__main__":
    sys.stdout.write(rules_markdown())
