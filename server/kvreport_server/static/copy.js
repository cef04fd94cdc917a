// "Copy as GitHub issue": copies the Markdown body kept in a read-only textarea. Everything else works without JavaScript.
document.addEventListener("click", async (ev) => {
  const btn = ev.target.closest("[data-copy-target]");
  if (!btn) return;
  const src = document.getElementById(btn.dataset.copyTarget);
  const status = document.getElementById("copy-status");
  if (!src) return;
  try {
    await navigator.clipboard.writeText(src.value);
    if (status) status.textContent = "Copied.";
  } catch (e) {
    src.classList.remove("visually-hidden");
    src.select();
    if (status) status.textContent = "Press Ctrl+C to copy.";
  }
});
