"""An answer rendered as Markdown, with every character still inside the coloured span of the token that made it.

markdown-it-py parses the whole answer text (raw HTML off: it stays text). Each piece of text the Markdown
shows (a word of a paragraph, a run of a code block) is aligned back to its offset in the answer, and from
there to its token; the piece is split where the token changes. Fenced code is highlighted with Pygments and
its runs are split the same way, so a code token carries both its Pygments class and its speculation kind.
Markup characters (``**``, ``#``, fences) are not shown here; the "tokens" view shows every token as is.
Pure functions of the token list, no gradio.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from markdown_it import MarkdownIt
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.token import STANDARD_TYPES
from pygments.util import ClassNotFound

from app.views.render import esc, esc_text, ghost_html, kind_class, token_title
from engine.events import TokenEvent

MD = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
SAFE_SCHEMES = ("http://", "https://", "mailto:")
HL_PREFIX = "hl-"  # Pygments classes get a prefix so they cannot collide with Gradio's
LOOKAHEAD = 12  # how far a character changed by Markdown (escape, entity) may sit from where it shows
SIMPLE_TAGS = {"paragraph", "heading", "bullet_list", "list_item", "blockquote", "em", "strong", "s", "table",
               "thead", "tbody", "tr", "th", "td"}


def pygments_css() -> str:
    """Colours for the highlighted code (text colour only: the background stays the token kind's)."""
    return HtmlFormatter(style="default", classprefix=HL_PREFIX).get_style_defs(".md-code")


@dataclass(frozen=True)
class SourceText:
    """The answer text as markdown-it sees it (\\r\\n -> \\n, NUL -> U+FFFD), with the token of every character."""
    text: str
    owner: tuple[int, ...]  # owner[i]: index into the token list of the token that produced text[i]
    line_starts: tuple[int, ...]

    @classmethod
    def of(cls, tokens: list[TokenEvent]) -> "SourceText":
        chars: list[str] = []
        owner: list[int] = []
        previous = ""
        for i, ev in enumerate(tokens):
            for ch in ev.text:
                if not (ch == "\n" and previous == "\r"):  # \r\n -> one \n, owned by the token of the \r
                    chars.append("\n" if ch == "\r" else "\ufffd" if ch == "\0" else ch)
                    owner.append(i)
                previous = ch
        text = "".join(chars)
        starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]
        return cls(text, tuple(owner), tuple(starts))

    def line_offset(self, line: int) -> int:
        return self.line_starts[line] if line < len(self.line_starts) else len(self.text)


@dataclass
class _Writer:
    """Turns shown text pieces into token spans; remembers which tokens already showed their ghost."""
    source: SourceText
    tokens: list[TokenEvent]
    cursor: int = 0  # where the next piece is looked for
    end: int = 0  # the current block's end offset
    ghosted: set[int] = field(default_factory=set)
    titles: dict[int, str] = field(default_factory=dict)

    def enter(self, line_map) -> None:
        if line_map:
            self.cursor = max(self.cursor, self.source.line_offset(line_map[0]))
            self.end = self.source.line_offset(line_map[1])

    def align(self, piece: str) -> list[int]:
        """Source offsets of each character of ``piece``, searching forward from the cursor."""
        text, end = self.source.text, max(self.end, self.cursor)
        at = text.find(piece, self.cursor, end)
        if at >= 0:
            self.cursor = at + len(piece)
            return list(range(at, at + len(piece)))
        offsets = []
        for ch in piece:  # changed by Markdown (escape, entity): match character by character, nearby only
            j = text.find(ch, self.cursor, min(end, self.cursor + LOOKAHEAD))
            if j >= 0:
                self.cursor = j + 1
            offsets.append(j if j >= 0 else max(self.cursor - 1, 0))
        return offsets

    def spans(self, piece: str, extra_class: str = "", code: bool = False) -> str:
        """``piece`` (text the Markdown shows) as one span per run of characters from the same token."""
        if not piece:
            return ""
        offsets = self.align(piece)
        owners = [self.source.owner[o] if o < len(self.source.owner) else len(self.tokens) - 1 for o in offsets]
        out, start = [], 0
        for i in range(1, len(piece) + 1):
            if i == len(piece) or owners[i] != owners[start]:
                out.append(self._span(owners[start], piece[start:i], extra_class, code))
                start = i
        return "".join(out)

    def _span(self, index: int, text: str, extra_class: str, code: bool) -> str:
        ev = self.tokens[index]
        ghost = ""
        if index not in self.ghosted:
            self.ghosted.add(index)
            ghost = ghost_html(ev)  # the "show rejected" switch hides it with CSS
        if index not in self.titles:
            self.titles[index] = esc(token_title(ev))
        css = f"{kind_class(ev.kind)} {extra_class}".rstrip()
        body = esc_text(text) if code else esc(text)
        return f'{ghost}<span class="{css}" title="{self.titles[index]}">{body}</span>'


@lru_cache(maxsize=64)
def _lexer(lang: str):
    """The lexer for a fence's language, made once per language: a streaming answer's code is highlighted again at
    every frame, and finding a lexer by name costs more than lexing a short block."""
    try:
        return get_lexer_by_name(lang or "text", stripnl=False, ensurenl=False, stripall=False)
    except ClassNotFound:
        return get_lexer_by_name("text", stripnl=False, ensurenl=False)


def _hl_class(ttype) -> str:
    while ttype not in STANDARD_TYPES:
        ttype = ttype.parent
    short = STANDARD_TYPES[ttype]
    return f"{HL_PREFIX}{short}" if short else ""


def code_block(w: _Writer, content: str, lang: str) -> str:
    """A code block: Pygments runs, each split at token boundaries."""
    content = content[:-1] if content.endswith("\n") else content  # the closing fence's line break
    runs = list(_lexer(lang).get_tokens(content))
    if "".join(v for _, v in runs) != content:  # a lexer that rewrote the text: show it unhighlighted
        runs = [(None, content)]
    body = "".join(w.spans(value, _hl_class(ttype) if ttype is not None else "", code=True)
                   for ttype, value in runs)
    lang_attr = f' data-lang="{esc(lang)}"' if lang else ""
    return f'<pre class="md-code"{lang_attr}><code>{body}</code></pre>'


def _link_open(token) -> str:
    href = str(token.attrs.get("href", ""))
    if href.lower().startswith(SAFE_SCHEMES):
        return f'<a href="{esc(href)}" target="_blank" rel="noopener noreferrer nofollow">'
    return '<span class="md-link">'  # anything else (relative, other schemes) shows as text


def inline(w: _Writer, children) -> str:
    out, links = [], []  # links: the closing tag of each open link
    for t in children:
        base = t.type.rsplit("_", 1)[0] if t.type.endswith(("_open", "_close")) else t.type
        if t.type in ("text", "text_special"):
            out.append(w.spans(t.content))
        elif t.type == "code_inline":
            out.append(f'<code class="md-inline-code">{w.spans(t.content)}</code>')
        elif t.type == "softbreak":
            out.append(" ")
        elif t.type == "hardbreak":
            out.append("<br>")
        elif t.type == "link_open":
            out.append(_link_open(t))
            links.append("</a>" if out[-1].startswith("<a ") else "</span>")
        elif t.type == "link_close":
            out.append(links.pop() if links else "")
        elif t.type == "image":  # never an <img>: its description, as text
            out.append(f'<span class="md-image">[{inline(w, t.children or [])}]</span>')
        elif base in SIMPLE_TAGS:
            out.append(f"<{'/' if t.nesting < 0 else ''}{t.tag}>")
        elif t.content:  # anything else markdown-it may add: its text, escaped
            out.append(w.spans(t.content))
    return "".join(out)


def _block_tag(t) -> str:
    if t.type == "ordered_list_open":
        start = t.attrs.get("start")
        return f'<ol start="{int(start)}">' if start is not None else "<ol>"
    if t.type == "ordered_list_close":
        return "</ol>"
    return f"<{'/' if t.nesting < 0 else ''}{t.tag}>"


def render_markdown(tokens: list[TokenEvent]) -> str:
    """The tokens' text as Markdown HTML, each shown character inside its token's coloured span."""
    source = SourceText.of(tokens)
    w = _Writer(source, tokens)
    out = []
    for t in MD.parse(source.text):
        base = t.type.rsplit("_", 1)[0]
        w.enter(t.map)
        if t.type == "inline":
            out.append(inline(w, t.children or []))
        elif t.type == "fence":
            w.enter([t.map[0] + 1, t.map[1]])
            out.append(code_block(w, t.content, t.info.strip().split(" ")[0] if t.info else ""))
        elif t.type == "code_block":
            out.append(code_block(w, t.content, ""))
        elif t.type == "hr":
            out.append("<hr>")
        elif t.hidden:  # paragraphs of tight lists
            continue
        elif base in SIMPLE_TAGS or base == "ordered_list":
            out.append(_block_tag(t))
        elif t.content:
            out.append(f"<p>{w.spans(t.content)}</p>")
    return "".join(out)
