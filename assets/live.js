// The chat's live box (gr.HTML js_on_load; `element` is the box, `watch` runs after Gradio redraws its value).
// Gradio writes the box at an answer's start (its question, an empty answer carrying data-live-stream, the URL of
// the answer's own stream) and at its end (the whole answer). Between the two, this reads that stream
// (app/api/live_stream.py), a line of JSON a frame: `raw` is the new tokens' spans, appended to the raw view; `md`
// the Markdown view of the answer so far, `note` the cache note and `panel` the statistics panel, each replaced
// (only their changed blocks). A redraw costs the page the new tokens and blocks, not the answer: no Gradio message,
// status tracker or morph of both views per frame.
const html = (node) => (node.nodeType === 1 ? node.outerHTML : node.textContent);
// The Markdown view as `markup` says, its unchanged leading blocks left alone: while an answer streams only its last
// block or two change, so only those are parsed into the page, laid out and painted again, not the whole answer.
const replaceBlocks = (view, markup) => {
  const next = document.createElement("template");
  next.innerHTML = markup;
  const fresh = [...next.content.childNodes], old = [...view.childNodes];
  let same = 0;
  while (same < fresh.length && same < old.length && old[same].__speclensHtml === html(fresh[same])) same += 1;
  old.slice(same).forEach((node) => node.remove());
  for (const node of fresh.slice(same)) {
    node.__speclensHtml = html(node);
    view.appendChild(node);
  }
};
const follow = async (url) => {
  if (element.__speclensLive === url) return;
  element.__speclensLive = url;
  let response;
  try { response = await fetch(url, { cache: "no-store" }); } catch (e) { return; }
  if (!response.ok || !response.body) return;  // ended already: Gradio's last write shows the whole answer
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let raw = "", buffer = "";
  const draw = (added, latest) => {
    const box = element.querySelector(`[data-live-stream="${CSS.escape(url)}"]`);
    if (!box) return false;  // the answer ended (or a new one began): Gradio has written the box since
    const view = box.querySelector(".raw-view");
    if (view && added) {
      if (view.dataset.shown === String(raw.length - added.length)) view.insertAdjacentHTML("beforeend", added);
      else view.innerHTML = raw;  // the first frame, or Gradio redrew the box: all the spans so far
      view.dataset.shown = String(raw.length);
    }
    const md = box.querySelector(".md-view"), note = box.querySelector(".live-note");
    if (md && latest.md !== undefined) replaceBlocks(md, latest.md);
    if (note && latest.note !== undefined) note.innerHTML = latest.note;
    const panel = document.querySelector("#stats .stats-panel");  // the statistics beside the chat
    if (panel && latest.panel !== undefined) {
      const next = document.createElement("template");
      next.innerHTML = latest.panel;
      if (next.content.firstElementChild) replaceBlocks(panel, next.content.firstElementChild.innerHTML);
    }
    return true;
  };
  for (;;) {
    let chunk;
    try { chunk = await reader.read(); } catch (e) { return; }
    if (chunk.done) return;
    buffer += chunk.value;
    const lines = buffer.split("\n");
    buffer = lines.pop();
    let added = "";
    const latest = {};
    for (const line of lines) {
      if (!line) continue;
      const frame = JSON.parse(line);
      added += frame.raw || "";
      if (frame.md !== undefined) latest.md = frame.md;
      if (frame.note !== undefined) latest.note = frame.note;
      if (frame.panel !== undefined) latest.panel = frame.panel;
    }
    raw += added;
    if ((added || Object.keys(latest).length) && !draw(added, latest)) { reader.cancel(); return; }
  }
};
watch("value", () => {
  const box = element.querySelector("[data-live-stream]");
  if (box) follow(box.dataset.liveStream);
});
