// The console's shell: log-in, the hash router (#/overview, #/queues, #/queue/<name>, ...)
// and the refresh of the page shown (every REFRESH_MS while the tab is visible).

import * as api from './api.js';
import { clearNotice, notice } from './ui.js';
import * as overview from './overview.js';
import * as lists from './lists.js';
import * as entity from './entity.js';
import * as connections from './connections.js';

const REFRESH_MS = 5000;
const PAGES = {
  overview: (main) => overview.render(main),
  queues: (main, _, query) => lists.render(main, 'queues', query),
  subscriptions: (main, _, query) => lists.render(main, 'subscriptions', query),
  queue: (main, name, query) => entity.render(main, 'queue', name, query),
  subscription: (main, name, query) => entity.render(main, 'subscription', name, query),
  connections: (main) => connections.render(main),
};
const TAB_OF = { queue: 'queues', subscription: 'subscriptions' };

let current = null;
let timer = null;

function parse() {
  const [route, search] = (location.hash.replace(/^#\/?/, '') || 'overview').split('?');
  const [page, ...rest] = route.split('/');
  return {
    page: PAGES[page] ? page : 'overview',
    name: rest.length ? decodeURIComponent(rest.join('/')) : '',
    query: Object.fromEntries(new URLSearchParams(search || '')),
  };
}

// errors of any page: 401 opens the log-in form, anything else is shown in the notice bar
function failed(error) {
  if (error instanceof api.ApiError && error.status === 401) {
    showLogin(api.user() ? 'The user or password was not accepted.' : '');
    return;
  }
  notice(error.message || String(error), 'error');
}

function showLogin(message) {
  document.getElementById('main').hidden = true;
  document.getElementById('tabs').hidden = true;
  document.getElementById('login').hidden = false;
  const error = document.getElementById('login-error');
  error.textContent = message;
  error.hidden = !message;
  document.getElementById('login-user').focus();
}

function showWho() {
  const who = api.user();
  document.getElementById('who').textContent = who ? `User: ${who}` : '';
  document.getElementById('logout').hidden = !who;
}

async function route() {
  clearInterval(timer);
  if (current && current.stop) current.stop();
  current = null;
  clearNotice();  // a notice tells of the page it was given on
  const { page, name, query } = parse();
  for (const a of document.querySelectorAll('#tabs a')) {
    a.classList.toggle('active', a.dataset.tab === (TAB_OF[page] || page));
  }
  const main = document.getElementById('main');
  main.hidden = false;
  document.getElementById('tabs').hidden = false;
  document.getElementById('login').hidden = true;
  main.replaceChildren();
  showWho();
  try {
    current = await PAGES[page](main, name, query);
  } catch (error) {
    failed(error);
    return;
  }
  let reading = false;  // a slow read is not stacked on by the next tick
  timer = setInterval(() => {
    if (reading || document.hidden || !current || !current.refresh) return;
    reading = true;
    current.refresh().catch(failed).finally(() => { reading = false; });
  }, REFRESH_MS);
}

function start() {
  document.getElementById('login-form').addEventListener('submit', (event) => {
    event.preventDefault();
    api.login(document.getElementById('login-user').value,
      document.getElementById('login-password').value);
    document.getElementById('login-password').value = '';
    route();
  });
  document.getElementById('logout').addEventListener('click', () => {
    api.logout();
    clearInterval(timer);
    showWho();
    showLogin('');
  });
  window.addEventListener('shoal:failed', (event) => failed(event.detail));
  window.addEventListener('hashchange', route);
  route();
}

start();
