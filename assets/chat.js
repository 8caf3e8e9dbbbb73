// The chat's finished messages (gr.HTML js_on_load; `element` is the component's own box, `watch` runs after Gradio
// has drawn a new value into it). Gradio's value is one write (app/views/render.py chat_write): keep the first
// data-keep messages, append the write's. The messages live in a list beside `element` that Gradio never draws,
// so a write costs the page its new messages: the earlier ones are not rendered, sanitised or morphed again
// (a gr.Chatbot draws every message at each change; docs/bench.md).
const log = document.createElement("div");
log.className = "chat-log";
log.setAttribute("role", "log");
element.parentNode.insertBefore(log, element);
element.style.display = "none";
let last = null;  // the last write applied: a value Gradio draws again is not appended twice
const apply = () => {
  const write = element.querySelector(".chat-write");
  if (!write || write.dataset.write === last) return;
  last = write.dataset.write;
  const keep = Number(write.dataset.keep) || 0;
  while (log.children.length > keep) log.lastElementChild.remove();
  const follows = log.scrollHeight - log.scrollTop - log.clientHeight < 80;  // at the bottom: stay there
  for (const message of [...write.children]) log.appendChild(message);
  write.remove();  // moved, not copied: the box Gradio draws into stays empty
  if (follows) log.scrollTop = log.scrollHeight;
};
log.addEventListener("click", (e) => {
  const button = e.target.closest(".chat-copy");
  if (!button) return;
  navigator.clipboard?.writeText(button.dataset.text || "").then(() => {
    button.textContent = "✓";
    setTimeout(() => { button.textContent = "⧉"; }, 1200);
  }, () => {});
});
apply();
watch("value", apply);
