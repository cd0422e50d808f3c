"""MkDocs hook: the configuration reference, generated from ``Config``'s field docs."""

from agent.config import config_reference

MARKER = "<!-- config-reference -->"


def on_page_markdown(markdown: str, **_: object) -> str:
    return markdown.replace(MARKER, config_reference()) if MARKER in markdown else markdown
