// Shows each UTC time in the reader's own zone as a tooltip; the page works without it.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  for (const el of document.querySelectorAll("time[datetime]")) {
    const when = new Date(el.getAttribute("datetime"));
    if (!Number.isNaN(when.getTime())) {
      el.title = when.toLocaleString() + " (your time)";
    }
  }
});
