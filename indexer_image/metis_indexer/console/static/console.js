// Live updates: each element with data-stream follows its Server-Sent Events and
// takes each update's HTML (rendered and escaped by the server) in place.
"use strict";

document.querySelectorAll("[data-stream]").forEach((element) => {
  const source = new EventSource(element.dataset.stream);
  source.addEventListener("update", (event) => {
    element.innerHTML = event.data;
    element.dataset.updates = String(Number(element.dataset.updates || 0) + 1);
  });
});

// "/" jumps to the question box, as on most search pages.
document.addEventListener("keydown", (event) => {
  const box = document.getElementById("q");
  const typing = ["INPUT", "TEXTAREA", "SELECT"].includes(document.activeElement.tagName);
  if (event.key === "/" && box && !typing) {
    event.preventDefault();
    box.focus();
  }
});
