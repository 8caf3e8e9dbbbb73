"""app/views/markdown.py: the Markdown view keeps every shown character in its token's span, escaped, with safe
links and Pygments classes in code."""
import re

import pytest

from app.views.markdown import SourceText, render_markdown
from app.views.render import render_token
from tests.helpers.fakes import IMG, SCRIPT, assert_inert, tok, toks


def spans_text(html: str) -> list[tuple[str, str]]:
    """(kind, text) of every token span, in order (ghosts included as "rejected")."""
    return [(k, t) for k, t in re.findall(r'<span class="tok tok-([a-z]+)[^"]*" title="[^"]*">([^<]*)</span>', html)]


def test_code_fence_becomes_pre_code_with_token_and_pygments_classes():
    html = render_markdown(toks("Here:\n```py", "thon\ndef ad", "d(a, b):\n    re", "turn a + b\n```\nDone."))
    assert '<pre class="md-code" data-lang="python"><code>' in html
    code = html.split("<code>")[1].split("</code>")[0]
    assert 'class="tok tok-corrected hl-k"' in code  # "def": Pygments keyword inside a corrected token
    assert 'class="tok tok-bonus' in code and 'class="tok tok-plain' in code
    assert "```" not in html and "python" not in code  # the fence lines are markup, not shown
    assert "    " in code  # indentation kept
    assert html.endswith("<p>" + html.split("<p>")[-1]) and "Done." in html.split("</pre>")[1]


def test_every_shown_character_keeps_its_token_across_markdown_syntax():
    pieces = ("# Ti", "tle\n\nSome **bo", "ld** and `co", "de` and *it", "al*\n\n- a", "\n- b")
    html = render_markdown(toks(*pieces))
    assert "<h1>" in html and "<strong>" in html and '<code class="md-inline-code">' in html and "<em>" in html
    assert "<ul><li>" in html
    shown = [(k, t) for k, t in spans_text(html) if k != "rejected"]
    # "bo" and "ld" come from different tokens: the bold word is split at the token boundary
    assert ("corrected", "bo") in shown and ("bonus", "ld") in shown
    assert ("bonus", "co") in shown and ("plain", "de") in shown
    kinds = {0: "accepted", 1: "corrected", 2: "bonus", 3: "plain"}
    for k, t in shown:  # each shown piece lies inside a token of that kind
        assert any(t in p for i, p in enumerate(pieces) if kinds[i % 4] == k), (k, t)


def test_rejected_ghost_and_tooltip_survive_in_the_markdown_view():
    html = render_markdown(toks("Say ", "**hi**"))
    assert '<span class="tok tok-rejected" title="rejected draft token">RJ</span>' in html
    assert html.count("tok-rejected") == 1  # once per token, though the token shows in several pieces
    assert "p_target 0.900" in html and "rejected draft token &#x27;RJ&#x27;" in html


@pytest.mark.parametrize("view", ["tokens", "markdown"])
def test_a_rejected_special_token_is_a_small_named_badge_escaped(view):
    def shown(rejected: str, special: str | None) -> str:
        ev = tok("Hi", "corrected", rejected_token_id=7, rejected_text=rejected, rejected_special=special)
        return render_token(ev) if view == "tokens" else render_markdown([ev])

    end = shown("<|im_end|>", "end")
    assert '<span class="tok tok-rejected tok-special" title="rejected draft token &lt;|im_end|&gt;">end of answer' \
           "</span>" in end
    assert "<|im_end|>" not in end
    other = shown("<|im_start|><b>", "control")  # any other special token: its own name, escaped
    assert ">&lt;|im_start|&gt;&lt;b&gt;</span>" in other and "<b>" not in other and "tok-special" in other
    plain = shown("<|im_end|>", None)  # text that only looks like one stays struck-through text
    assert "tok-special" not in plain and "&lt;|im_end|&gt;</span>" in plain


@pytest.mark.parametrize("evil", [SCRIPT, IMG, "<a href='x' onclick='alert(1)'>x</a>", "```\n<script>x</script>\n```"])
def test_markdown_view_escapes_raw_html(evil):
    html = render_markdown(toks("ok ", evil))
    assert_inert(html)
    assert "<a " not in html and "onclick='" not in html
    assert "&lt;" in html


def test_javascript_links_are_not_links_and_http_links_are_safe():
    html = render_markdown(toks("[x](javascript:alert(1)) [y](JAVASCRIPT:alert(2)) [z](data:text/html,hi) ",
                                "[ok](https://example.com/a?b=1&c=2) ![img](https://e.com/i.png)"))
    assert re.findall(r'href="([^"]*)"', html) == ["https://example.com/a?b=1&amp;c=2"]
    assert "[x](javascript:alert(1))" in html  # shown as the text it is
    assert html.count("<a ") == 1
    assert 'rel="noopener noreferrer nofollow"' in html
    assert "<img" not in html and "md-image" in html


def test_source_text_normalises_line_ends_like_markdown_it():
    src = SourceText.of(toks("a\r", "\nb\rc\0"))
    assert src.text == "a\nb\nc\ufffd" and src.owner == (0, 0, 1, 1, 1, 1)
