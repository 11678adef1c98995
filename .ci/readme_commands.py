"""Print the README's set-up commands (the bash blocks under '## Set-up'), one per line, as written.

.ci/run runs exactly these lines, so the README and CI cannot disagree: change one, change both.
Exit 1 when the section or its two blocks are missing.
"""

import re
import sys
from pathlib import Path

text = Path(__file__).resolve().parent.parent.joinpath("README.md").read_text()
section = re.search(r"^## Set-up\n(.*?)^## ", text, re.S | re.M)
blocks = re.findall(r"```bash\n(.*?)```", section.group(1), re.S) if section else []
if len(blocks) != 2 or any(len(b.strip().splitlines()) != 1 for b in blocks):
    sys.exit("README.md: '## Set-up' must hold two one-line bash blocks (main job, tests)")
print("\n".join(b.strip() for b in blocks))
