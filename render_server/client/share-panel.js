// Sharing on the designer page (docs/sharing.md): the owner's Share button and its panel (the
// link, when it expires, its QR code), viewer mode for a page opened from a link
// (`#watch=<token>`), and the presence list: who watches, who steers, the hand-over buttons.
//
// Everything here that came from elsewhere (a link, a QR code, other people's names) goes into
// the page as text or as an <img>, never as markup: an <img> runs no script an SVG may carry.
import { State } from './render-stream.js';
import { showStatus } from './status.js';

const NAME_KEY = 'render-server.viewer-name';
const DEFAULT_NAME = 'viewer';
const MAX_NAME_CHARS = 40;
const MAX_QR_CHARS = 256 * 1024;
const $ = (id) => document.getElementById(id);

/**
 * Viewer mode: `{token, name}` where the page's URL fragment is `#watch=<token>` (a share
 * link; the token may be empty, which the server refuses), null otherwise.
 */
export function viewerMode(hash = location.hash) {
  const fragment = new URLSearchParams(hash.replace(/^#/, ''));
  return fragment.has('watch') ? { token: fragment.get('watch'), name: viewerName() } : null;
}

/** A name as the server takes it: printable characters, single spaces, at most 40. */
export function cleanName(text) {
  const name = String(text || '').replace(/\p{C}/gu, ' ').split(/\s+/).filter(Boolean).join(' ');
  return Array.from(name).slice(0, MAX_NAME_CHARS).join('').trim();
}

/** The name this browser watches under: `?name=`, else the one it used last, else "viewer". */
export function viewerName() {
  let stored = null;
  try { stored = localStorage.getItem(NAME_KEY); } catch { /* storage off */ }
  return cleanName(new URLSearchParams(location.search).get('name')) || cleanName(stored) || DEFAULT_NAME;
}

function storeName(name) {
  try { localStorage.setItem(NAME_KEY, name); } catch { /* storage off */ }
}

// -- the share panel ----------------------------------------------------------------------------

/**
 * The QR code of a link as an <img> (a data: URL of the server's SVG): an SVG shown as an
 * image runs no script and loads nothing, whatever it holds. Null for anything but an SVG.
 */
export function qrImage(svg) {
  if (typeof svg !== 'string' || svg.length > MAX_QR_CHARS || !/^\s*(<\?xml[^>]*>\s*)?<svg[\s>]/.test(svg)) return null;
  const img = document.createElement('img');
  img.id = 'share-qr-image';
  img.alt = 'QR code of the share link';
  img.src = `data:image/svg+xml;charset=utf-8,${encodeURIComponent(svg)}`;
  return img;
}

function element(tag, props = {}, ...children) {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children);
  return node;
}

function untilText(expiresAt, now) {
  const at = new Date(expiresAt * 1000);
  const minutes = Math.round((at.getTime() - now) / 60000);
  const left = minutes >= 2880 ? `${Math.round(minutes / 1440)} days`
    : minutes >= 120 ? `${Math.round(minutes / 60)} hours` : `${Math.max(0, minutes)} min`;
  return { at, text: `${at.toLocaleString()} (in ${left})` };
}

/**
 * Fills `panel` with a `session.shared` answer (`stream.share()`'s): the link in a read-only
 * field with a Copy button, when it expires, and its QR code. Returns the panel.
 */
export function renderShareLink(panel, shared, now = Date.now(), { onStop = null } = {}) {
  const link = element('input', { id: 'share-link', type: 'text', readOnly: true, value: shared.url || '' });
  link.setAttribute('aria-label', 'share link');
  link.addEventListener('focus', () => link.select());
  const copy = element('button', { id: 'share-copy', type: 'button', textContent: 'Copy' });
  copy.addEventListener('click', () => copyLink(link, copy));
  const { at, text } = untilText(Number(shared.expiresAt) || 0, now);
  const expires = element('time', { id: 'share-expires', dateTime: at.toISOString(), textContent: text });
  const qr = element('div', { id: 'share-qr' });
  const img = qrImage(shared.qrSvg);
  if (img) qr.append(img);
  qr.hidden = !img;
  panel.replaceChildren(
    element('h2', { textContent: 'Share this session' }),
    element('p', { className: 'share-help', textContent: 'Anyone with this link can watch live, but not steer, until you hand them control.' }),
    element('div', { className: 'share-row' }, link, copy),
    element('p', { className: 'share-expiry' }, 'New viewers can join until ', expires, '.'),
    qr,
    closeButton(panel),
  );
  if (onStop) {  // beside Close, above the QR code: the panel's other end may be covered
    const stop = element('button', { id: 'share-stop', type: 'button', textContent: 'Stop sharing' });
    stop.title = 'Withdraw every link to this session and disconnect its viewers';
    stop.addEventListener('click', onStop);
    qr.before(stop);
  }
  panel.hidden = false;
  return panel;
}

function renderShareNote(panel, text, error = false) {
  const note = element('p', { id: 'share-error', textContent: text });
  note.classList.toggle('error', error);
  panel.replaceChildren(element('h2', { textContent: 'Share this session' }), note, closeButton(panel));
  panel.hidden = false;
}

function closeButton(panel) {
  const close = element('button', { id: 'share-close', type: 'button', textContent: 'Close' });
  close.addEventListener('click', () => { panel.hidden = true; });
  return close;
}

async function copyLink(link, button) {
  let copied = false;
  try {
    await navigator.clipboard.writeText(link.value);
    copied = true;
  } catch {
    link.select();  // no clipboard access (an insecure origin, a refused permission)
    try { copied = document.execCommand('copy'); } catch { /* selected: the user copies */ }
  }
  button.textContent = copied ? 'Copied' : 'Press Ctrl+C';
  setTimeout(() => { button.textContent = 'Copy'; }, 2000);
}

// -- presence -------------------------------------------------------------------------------

function peerName(peer) {
  return peer?.name || (peer?.role === 'owner' ? 'the designer' : 'a viewer');
}

/** One line about who steers, from this page's side: "Watching — alice is steering". */
export function presenceSentence(presence, watching) {
  const peers = presence.peers || [];
  const steerer = peers.find((p) => p.id === presence.steering);
  if (presence.steering === presence.you) {
    const viewers = peers.filter((p) => p.role === 'viewer' && p.id !== presence.you).length;
    return watching || !viewers ? 'You are steering' : `You are steering · ${viewers} watching`;
  }
  return `${watching ? 'Watching — ' : ''}${peerName(steerer)} is steering`;
}

/**
 * Shows `presence` in `box`: the sentence (#presence-status), a list of who is connected
 * (#presence-list, an <li data-peer="id"> each) with a "Hand control" button on the others
 * (button.hand-control[data-peer]) for the owner and the steering page, a "Remove" button on
 * each viewer (button.remove-viewer[data-peer]) for the owner, and "Take control"
 * (#take-control) for the owner while a viewer steers.
 */
export function renderPresence(box, presence, { watching = false, onHand = () => {}, onTake = () => {}, onRemove = () => {} } = {}) {
  const { you, steering } = presence;
  const owner = you === 'owner';
  const mayHand = owner || steering === you;
  const list = element('ul', { id: 'presence-list' });
  for (const peer of presence.peers || []) {
    const item = element('li', {}, element('span', { className: 'peer-name', textContent: peerName(peer) }));
    item.dataset.peer = peer.id;
    item.dataset.role = peer.role;
    const tags = [peer.role === 'owner' ? 'owner' : 'viewer'];
    if (peer.id === you) tags.push('you');
    if (peer.id === steering) { tags.push('steering'); item.classList.add('steering'); }
    item.append(element('span', { className: 'peer-tags', textContent: ` (${tags.join(', ')})` }));
    if (mayHand && peer.id !== you && peer.id !== steering) {
      const hand = element('button', { type: 'button', className: 'hand-control', textContent: 'Hand control' });
      hand.dataset.peer = peer.id;
      hand.addEventListener('click', () => onHand(peer.id));
      item.append(hand);
    }
    if (owner && peer.role === 'viewer') {
      const remove = element('button', { type: 'button', className: 'remove-viewer', textContent: 'Remove' });
      remove.dataset.peer = peer.id;
      remove.addEventListener('click', () => onRemove(peer.id));
      item.append(remove);
    }
    list.append(item);
  }
  const take = element('button', { id: 'take-control', type: 'button', textContent: 'Take control' });
  take.hidden = !(owner && steering !== you);
  take.addEventListener('click', () => onTake());
  box.replaceChildren(element('p', { id: 'presence-status', textContent: presenceSentence(presence, watching) }), list, take);
  box.dataset.steering = String(steering === you);
  // the owner alone needs no list; a viewer always sees who steers
  box.hidden = !watching && (presence.peers || []).length < 2;
}

// -- what went wrong, in a sentence ------------------------------------------------------------

const WATCH_SENTENCES = {
  bad_message: 'This share link is incomplete: ask for a new one.',
  unauthorized: 'This share link has expired or is not valid: ask for a new one.',
  forbidden: 'This link cannot be used to watch this session.',
  unknown_session: 'The shared session has ended.',
  session_ended: 'The shared session has ended.',
  revoked: 'The owner stopped sharing this session.',
  removed: 'The owner removed you from this session.',
  too_many_viewers: 'Too many people are watching this session: try again later.',
  sharing_off: 'Sharing is turned off for this session.',
  not_streaming: 'The shared session is not streaming right now: try again later.',
  peer_lost: 'The video connection to the shared session was lost: reload to watch again.',
  reconnect_failed: 'Lost the shared session: reload to watch again.',
  signaling_closed: 'Could not reach the render server: reload to try again.',
};

/**
 * A sentence for a viewer's stream that ended or failed (`state` event's detail), or null
 * where the page's own wording fits. `bad_offer` names the codecs, so its message is kept.
 */
export function watchEndSentence({ reason = '' }) {
  const code = /^\w+/.exec(reason)?.[0] || '';
  if (code === 'bad_offer') return `This browser cannot play the shared session's video (${reason.slice(code.length + 1).trim()}).`;
  return WATCH_SENTENCES[code] || null;
}

// -- the page -------------------------------------------------------------------------------

/**
 * Wires sharing into the designer page: `watching` is `viewerMode()`'s answer. The owner gets
 * #share-button (and #share-panel); a viewer gets #viewer-name and no Share button; both get
 * the presence box (#presence).
 */
export function setupSharing(stream, { watching = null } = {}) {
  document.body.classList.toggle('viewer', Boolean(watching));
  const box = $('presence');
  const panel = $('share-panel');
  const button = $('share-button');
  const failed = (what) => (error) => {
    showStatus(`${what}: ${error.message}`, true);
    setTimeout(() => { if (stream.state === State.STREAMING) showStatus(''); }, 4000);
  };
  const show = () => renderPresence(box, stream.presence, {
    watching: Boolean(watching),
    onHand: (peer) => stream.handControl(peer).catch(failed('Control not handed')),
    onTake: () => stream.takeControl().catch(failed('Control not taken')),
    onRemove: (peer) => stream.removeViewer(peer).catch(failed('Viewer not removed')),
  });
  stream.addEventListener('presence', show);
  stream.addEventListener('state', ({ detail }) => {
    if (detail.state === State.ENDED || detail.state === State.ERROR) box.hidden = true;
    if (button) button.disabled = detail.state !== State.STREAMING;
  });

  if (watching) {
    button?.remove();
    panel?.remove();
    box.replaceChildren(element('p', { id: 'presence-status', textContent: 'Watching a shared session…' }));
    box.hidden = false;
    const name = $('viewer-name');
    name.value = watching.name || '';
    // a new name is taken when the page watches again: reload with it
    name.addEventListener('change', () => {
      const clean = cleanName(name.value);
      if (!clean || clean === watching.name) { name.value = watching.name; return; }
      storeName(clean);
      const url = new URL(location.href);
      url.searchParams.delete('name');
      if (url.href !== location.href) location.replace(url.href);
      else location.reload();
    });
    if (watching.name !== DEFAULT_NAME) storeName(watching.name);
    return;
  }
  const stop = async () => {
    try {
      await stream.stopSharing();
      renderShareNote(panel, 'Sharing stopped: the links open nothing now, and the viewers were disconnected.');
    } catch (error) {
      renderShareNote(panel, `Sharing not stopped: ${error.message}`, true);
    }
  };
  button.addEventListener('click', async () => {
    renderShareNote(panel, 'Making a link…');
    try {
      renderShareLink(panel, await stream.share(), Date.now(), { onStop: stop });
      $('share-link').focus();
    } catch (error) {
      renderShareNote(panel, `No link: ${error.message}`, true);
    }
  });
}
