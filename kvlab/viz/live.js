// kvlab LiveChart: a Vega view that follows its model (see kvlab/viz/live.py).
//
// Traits: `spec` (a Vega-Lite spec whose data are named datasets d0, d1, ... and which holds no
// rows) and `datasets` (name -> {column: JSON text of its values}). A new spec re-embeds the
// chart; new datasets under the same spec replace the rows of the existing view in place (view.data: no re-embed,
// no re-parse).
// The Vega runtime comes from the kernel by custom message (never part of the saved widget
// state), is imported once per page from a Blob URL and shared by every LiveChart on the page;
// with no kernel answering (a shared executed notebook) it falls back to esm.sh.

// Long enough for a kernel busy with the next cells of a run-all (comm messages wait for them).
const FALLBACK_MS = 15000;
const FALLBACK_URL = "https://esm.sh/vega-embed@7?deps=vega@6,vega-lite@6";

function runtime(model) {
  // The first of: the kernel's answer (however late), or esm.sh after FALLBACK_MS (which
  // fails without internet, and then the kernel's answer is still awaited).
  if (!globalThis.__kvlabVega) {
    const fromKernel = new Promise((resolve, reject) => {
      const onMessage = (msg) => {
        if (!msg || msg.type !== "kvlab-vega-runtime") return;
        model.off("msg:custom", onMessage);
        const url = URL.createObjectURL(new Blob([msg.source], { type: "text/javascript" }));
        import(url).then(resolve, reject).finally(() => URL.revokeObjectURL(url));
      };
      model.on("msg:custom", onMessage);
      model.send({ type: "kvlab-need-vega" });
    });
    let answered = false;
    fromKernel.then(() => { answered = true; }, () => {});
    const fromCdn = new Promise((r) => setTimeout(r, FALLBACK_MS)).then(
      () => (answered ? new Promise(() => {}) : import(FALLBACK_URL)));
    globalThis.__kvlabVega = Promise.any([fromKernel, fromCdn]);
    globalThis.__kvlabVega.catch(() => delete globalThis.__kvlabVega);
  }
  return globalThis.__kvlabVega;
}

function rowsOf(packed) {
  // packed: {column: JSON text of its values}
  const columns = {};
  for (const [name, text] of Object.entries(packed)) columns[name] = JSON.parse(text);
  const names = Object.keys(columns);
  const n = names.length ? columns[names[0]].length : 0;
  const rows = new Array(n);
  for (let i = 0; i < n; i++) {
    const row = {};
    for (const name of names) row[name] = columns[name][i];
    rows[i] = row;
  }
  return rows;
}

function render({ model, el }) {
  const box = document.createElement("div");
  box.className = "kvlab-live-chart";
  el.appendChild(box);
  let result = null; // vega-embed's result for the spec in `shown`
  let shown = null; // the spec object the view was embedded from
  let queue = Promise.resolve();
  let pending = false;

  const sync = async () => {
    pending = false;
    const spec = model.get("spec");
    const datasets = model.get("datasets");
    const runtimeModule = await runtime(model);
    const vegaEmbed = runtimeModule.vegaEmbed ?? runtimeModule.default;
    if (result && spec === shown) {
      // view.data(name, rows) = view.change(name, changeset().remove(all).insert(rows))
      for (const [name, columns] of Object.entries(datasets)) result.view.data(name, rowsOf(columns));
      await result.view.runAsync();
    } else {
      const full = { ...spec, datasets: {} };
      for (const [name, columns] of Object.entries(datasets)) full.datasets[name] = rowsOf(columns);
      const next = await vegaEmbed(box, full, { renderer: "svg", actions: false });
      if (result) result.finalize();
      result = next;
      shown = spec;
    }
    // for browser tests and benchmarks: which revision is drawn, when it arrived and was drawn
    box.dataset.kvlabRevision = String(model.get("revision"));
    box.dataset.kvlabDrawnMs = String(performance.now());
  };
  const schedule = () => {
    box.dataset.kvlabReceivedMs = String(performance.now());
    if (pending) return;
    pending = true;
    queue = queue.then(() => new Promise((r) => setTimeout(r, 0))).then(sync).catch((err) => {
      box.textContent = `kvlab chart error: ${err}`;
      console.error(err);
    });
  };
  model.on("change:revision", schedule);
  schedule();
  return () => {
    model.off("change:revision", schedule);
    if (result) result.finalize();
  };
}

export default { render };
