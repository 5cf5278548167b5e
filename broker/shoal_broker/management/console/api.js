// The management API as the console calls it: same origin, HTTP Basic with the user's own
// credentials (kept in this tab's sessionStorage only), JSON in and out.

const BASE = new URL('../api', document.baseURI).pathname;
const KEY = 'shoal.console.auth';

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error) || `HTTP ${status}`);
    this.status = status;
    this.body = body || {};
  }
}

export function user() {
  const saved = sessionStorage.getItem(KEY);
  return saved ? atob(saved).split(':')[0] : null;
}

export function login(name, password) {
  const bytes = new TextEncoder().encode(`${name}:${password}`);
  sessionStorage.setItem(KEY, btoa(String.fromCharCode(...bytes)));
}

export function logout() {
  sessionStorage.removeItem(KEY);
}

export function path(...parts) {
  return parts.map((p) => encodeURIComponent(p)).join('/');
}

// credentials 'omit': a 401 comes back to the console (its own login form) rather than
// opening the browser's password prompt; the Authorization header is set explicitly.
export async function call(method, route, { query, body } = {}) {
  const url = new URL(BASE + route, location.origin);
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== undefined && v !== null && v !== '') url.searchParams.set(k, v);
  }
  const headers = { Accept: 'application/json' };
  const saved = sessionStorage.getItem(KEY);
  if (saved) headers.Authorization = `Basic ${saved}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const response = await fetch(url, {
    method, headers, credentials: 'omit', cache: 'no-store',
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let found = null;
  try {
    found = await response.json();
  } catch {
    found = null;
  }
  if (!response.ok) throw new ApiError(response.status, found);
  return found;
}

export const get = (route, query) => call('GET', route, { query });
export const post = (route, body) => call('POST', route, { body });
export const del = (route) => call('DELETE', route);
