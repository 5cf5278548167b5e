// Backlog trends sampled in the browser: each read of a queue or subscription adds a point,
// so a trend covers the time the console has been watching (at most POINTS samples a name,
// NAMES names; the oldest names are forgotten first).

const POINTS = 120;
const NAMES = 5000;
const samples = new Map();

export function record(key, value) {
  let points = samples.get(key);
  if (!points) {
    if (samples.size >= NAMES) samples.delete(samples.keys().next().value);
    points = [];
    samples.set(key, points);
  }
  const now = Date.now();
  const last = points[points.length - 1];
  if (last && now - last[0] < 500) last[1] = value;  // the same moment read twice
  else points.push([now, value]);
  if (points.length > POINTS) points.shift();
  return points;
}

export function points(key) {
  return samples.get(key) || [];
}

const SVG = 'http://www.w3.org/2000/svg';

// A sparkline of the samples: a line and a filled area under it, scaled to the largest value.
export function sparkline(series, width = 120, height = 24) {
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('class', 'spark');
  svg.setAttribute('width', width);
  svg.setAttribute('height', height);
  svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
  svg.setAttribute('preserveAspectRatio', 'none');
  const values = series.map((p) => p[1]);
  const top = Math.max(1, ...values);
  const step = series.length > 1 ? width / (series.length - 1) : width;
  const y = (v) => (height - 2 - (v / top) * (height - 4)).toFixed(1);
  const coords = values.map((v, i) => `${(i * step).toFixed(1)},${y(v)}`);
  if (coords.length === 1) coords.push(`${width},${y(values[0])}`);
  if (coords.length) {
    const area = document.createElementNS(SVG, 'polygon');
    area.setAttribute('points', `0,${height} ${coords.join(' ')} ${width},${height}`);
    area.setAttribute('class', series.length > 1 ? 'spark-area' : 'spark-area first');
    const line = document.createElementNS(SVG, 'polyline');
    line.setAttribute('points', coords.join(' '));
    line.setAttribute('class', 'spark-line');
    svg.append(area, line);
  }
  const title = document.createElementNS(SVG, 'title');
  title.textContent = values.length
    ? `backlog over ${Math.round((series[series.length - 1][0] - series[0][0]) / 1000)} s: `
      + `${values[0]} → ${values[values.length - 1]} (max ${Math.max(...values)})`
    : 'no samples yet';
  svg.append(title);
  return svg;
}
