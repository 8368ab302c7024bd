"""mkdocs hook: every relative link must name a file of the checkout, inside docs/ or out
of it (plugins/, examples/, flakekit/...); mkdocs's own check knows only docs/ and would
reject the links to the rest of the repository.

The built site lives in site/ at the repository root, so a page's ``../examples/x``
resolves to the checkout's file when the site is opened from the checkout; a link whose
target does not exist is a warning (an error under ``--strict``).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

log = logging.getLogger("mkdocs.plugins.flakekit_links")

_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 - mkdocs API
    here = (Path(config["docs_dir"]) / page.file.src_path).parent
    for target in _LINK.findall(_FENCE.sub("", markdown)):
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target):
            continue  # external, in-page or absolute (mkdocs checks those)
        if not (here / target.split("#", 1)[0]).exists():
            log.warning("Doc file '%s' links to '%s', which does not exist in the checkout",
                        page.file.src_path, target)
    return markdown
