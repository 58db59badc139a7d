// A line chart on a plain <canvas>: a few series over time, the y axis from 0 to the
// largest value, the x axis the last `spanSeconds` ending now.
//
//   drawChart(canvas, {series: [{label, color, points: [[t, y], ...]}], spanSeconds: 600})

export function drawChart(canvas, { series, spanSeconds, now = Date.now() / 1000 }) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth, height = canvas.clientHeight;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  const g = canvas.getContext("2d");
  g.scale(ratio, ratio);
  g.clearRect(0, 0, width, height);

  const pad = { left: 48, right: 12, top: 12, bottom: 22 };
  const plotW = width - pad.left - pad.right, plotH = height - pad.top - pad.bottom;
  const start = now - spanSeconds;
  const top = niceCeiling(Math.max(4, ...series.flatMap((s) => s.points.map((p) => p[1]))));
  const x = (t) => pad.left + ((t - start) / spanSeconds) * plotW;
  const y = (v) => pad.top + plotH - (v / top) * plotH;

  // Axes and grid: four horizontal lines, a tick a minute.
  g.font = "11px sans-serif";
  g.strokeStyle = "#ddd";
  g.fillStyle = "#666";
  g.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const v = (top * i) / 4;
    g.beginPath(); g.moveTo(pad.left, y(v)); g.lineTo(pad.left + plotW, y(v)); g.stroke();
    g.fillText(formatNumber(v), 4, y(v) + 4);
  }
  for (let m = 0; m * 60 <= spanSeconds; m += 2) {
    const t = now - m * 60;
    g.fillText(m === 0 ? "now" : `-${m} min`, x(t) - 14, height - 6);
  }

  for (const s of series) {
    g.strokeStyle = s.color;
    g.lineWidth = 2;
    g.beginPath();
    s.points.filter((p) => p[0] >= start).forEach(([t, v], i) => (i ? g.lineTo(x(t), y(v)) : g.moveTo(x(t), y(v))));
    g.stroke();
  }
}

function niceCeiling(v) {  // 1, 2 or 5 times a power of ten, at least v
  const power = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 5, 10].map((m) => m * power).find((c) => c >= v);
}

export function formatNumber(v) {
  if (v >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (v >= 1e3) return `${(v / 1e3).toFixed(1)}k`;
  return Number.isInteger(v) ? String(v) : v.toFixed(1);
}
