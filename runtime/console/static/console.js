// Pages with data-refresh="N" on <body> fetch themselves every N seconds and replace <main>,
// unless the operator is typing in a form or has picked something (nothing is lost mid-action).
(function () {
  var seconds = Number(document.body.dataset.refresh || 0);
  if (!seconds) return;
  function busy() {
    var a = document.activeElement;
    if (a && (a.tagName === "INPUT" || a.tagName === "SELECT" || a.tagName === "TEXTAREA")) return true;
    return document.querySelector("main input[type=checkbox]:checked") !== null;
  }
  function refresh() {
    if (busy() || document.hidden) return;
    fetch(window.location.href, {credentials: "same-origin", headers: {"Accept": "text/html"}})
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html || busy()) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("main");
        var footer = doc.querySelector("footer");
        if (fresh) document.getElementById("main").replaceWith(fresh);
        if (footer) document.querySelector("footer").replaceWith(footer);
      })
      .catch(function () {});
  }
  setInterval(refresh, seconds * 1000);
})();
