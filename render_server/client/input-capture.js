// Mouse, wheel, keyboard, touch and gamepad on a DOM element → input events on a RenderStream.
// Coordinates and deltas are in units of the element's height, so a drag means the same on any
// screen; see docs/data-channel.md for the messages.

const NAVIGATION_KEYS = new Set(['ArrowUp', 'ArrowDown', 'ArrowLeft', 'ArrowRight', 'PageUp', 'PageDown', 'Space']);
const GAMEPAD_STEP = 0.01;  // axis changes below this are noise, not news
// at most one move message this often, deltas summed: a 1000 Hz mouse delivers a raw update a
// millisecond, which would pass the worker's 500 messages a second (and cost it a message's
// work each); 4 ms is a quarter of a 60 fps frame, and a move after a pause leaves at once
const MOVE_INTERVAL_MS = 4;

/**
 * Captures input on `surface` and sends it through `stream.sendInput`.
 * `pointerLock: true` makes a click on the surface capture the mouse (Esc releases it); while
 * captured, moving the mouse looks around without a button held.
 */
export class InputCapture {
  constructor(stream, surface, { pointerLock = false, keyboard = true, gamepad = true } = {}) {
    this.stream = stream;
    this.surface = surface;
    this.pointerLock = pointerLock;
    this._gamepadFrame = 0;
    this._lastPad = '';
    this._pendingMove = null;  // {move, timeStamp}: moves held back, summed, until the timer
    this._moveTimer = 0;
    this._lastMoveAt = -Infinity;
    this._off = [];
    if (surface.tabIndex < 0) surface.tabIndex = 0;  // keys need a focusable surface
    const on = (target, type, fn, options) => {
      target.addEventListener(type, fn, options);
      this._off.push(() => target.removeEventListener(type, fn, options));
    };
    on(surface, 'pointerdown', (e) => this._pointerDown(e));
    // pointerrawupdate comes as the OS delivers motion; pointermove waits for the next
    // animation frame (up to 16 ms more on a 60 Hz screen)
    const moveEvent = 'onpointerrawupdate' in window ? 'pointerrawupdate' : 'pointermove';
    on(surface, moveEvent, (e) => { if (e.pointerType !== 'touch') this._pointer('move', e); });
    on(surface, 'pointerup', (e) => { if (e.pointerType !== 'touch') this._pointer('up', e); });
    on(surface, 'contextmenu', (e) => e.preventDefault());
    on(surface, 'wheel', (e) => this._wheel(e), { passive: false });
    if (keyboard) {
      on(surface, 'keydown', (e) => this._key('down', e));
      on(surface, 'keyup', (e) => this._key('up', e));
    }
    for (const [dom, action] of [['touchstart', 'start'], ['touchmove', 'move'], ['touchend', 'end'], ['touchcancel', 'cancel']]) {
      on(surface, dom, (e) => this._touch(action, e), { passive: false });
    }
    on(window, 'blur', () => this._send({ type: 'blur' }, performance.now()));
    on(document, 'pointerlockchange', () => this.surface.dispatchEvent(
      new CustomEvent('pointerlockchange', { detail: { locked: this.locked } })));
    if (gamepad && 'getGamepads' in navigator) {
      on(window, 'gamepadconnected', () => this._pollGamepad());
    }
  }

  /** True while this surface holds the pointer lock. */
  get locked() { return document.pointerLockElement === this.surface; }

  /** Captures the mouse (must run in a user gesture, e.g. a click). */
  lock() {
    const result = this.surface.requestPointerLock?.();
    return Promise.resolve(result).catch(() => {});
  }

  unlock() { if (this.locked) document.exitPointerLock(); }

  /** Removes every listener this capture added. */
  detach() {
    this.unlock();
    cancelAnimationFrame(this._gamepadFrame);
    this._flushMove();
    for (const off of this._off) off();
    this._off = [];
  }

  /** The unit of coordinates and deltas: the surface's height in CSS pixels. */
  _unit(rect = this.surface.getBoundingClientRect()) { return rect.height || 1; }

  _pointerDown(event) {
    if (event.pointerType === 'touch') return;  // touch has its own handlers
    this.surface.focus({ preventScroll: true });
    if (this.pointerLock && !this.locked && event.button === 0) {
      this.lock();
      return;  // the capturing click steers nothing
    }
    if (!this.locked) this.surface.setPointerCapture?.(event.pointerId);
    this._pointer('down', event);
  }

  _pointer(action, event) {
    const rect = this.surface.getBoundingClientRect();
    const h = this._unit(rect);
    const locked = this.locked;
    const message = {
      type: 'pointer', action,
      x: locked ? 0 : (event.clientX - rect.left) / h, y: locked ? 0 : (event.clientY - rect.top) / h,
      dx: (event.movementX || 0) / h, dy: (event.movementY || 0) / h,
      buttons: event.buttons, shift: event.shiftKey, locked,
    };
    if (action === 'move') {
      this._move(message, event.timeStamp);
    } else {
      this._send(message, event.timeStamp);
    }
  }

  /** Any message but a move: the moves held back go first, in order. */
  _send(message, timeStamp) {
    this._flushMove();
    this.stream.sendInput(message, timeStamp);
  }

  /**
   * A move leaves at once where the last left MOVE_INTERVAL_MS ago; else it joins the one held
   * back (the newest position, the deltas summed, the first one's time stamp: input-to-photon
   * counts from the first), which a timer sends when the interval is up.
   */
  _move(move, timeStamp) {
    const held = this._pendingMove?.move;
    if (held && held.buttons === move.buttons && held.shift === move.shift && held.locked === move.locked) {
      held.x = move.x; held.y = move.y;
      held.dx += move.dx; held.dy += move.dy;
      return;
    }
    this._flushMove();  // a held move of another gesture ends as it was
    const wait = this._lastMoveAt + MOVE_INTERVAL_MS - performance.now();
    if (wait <= 0) {
      this._sendMove(move, timeStamp);
      return;
    }
    this._pendingMove = { move, timeStamp };
    this._moveTimer = setTimeout(() => this._flushMove(), wait);
  }

  _flushMove() {
    clearTimeout(this._moveTimer);
    const pending = this._pendingMove;
    this._pendingMove = null;
    if (pending) this._sendMove(pending.move, pending.timeStamp);
  }

  _sendMove(move, timeStamp) {
    this._lastMoveAt = performance.now();
    this.stream.sendInput(move, timeStamp);
  }

  _wheel(event) {
    event.preventDefault();
    const scale = event.deltaMode === 1 ? 16 : event.deltaMode === 2 ? this._unit() : 1;
    this._send({ type: 'wheel', dy: event.deltaY * scale }, event.timeStamp);
  }

  _key(action, event) {
    if (event.code === 'Escape' && action === 'down') this.unlock();
    if (NAVIGATION_KEYS.has(event.code)) event.preventDefault();
    if (event.repeat) return;
    this._send({ type: 'key', action, code: event.code }, event.timeStamp);
  }

  _touch(action, event) {
    event.preventDefault();
    const rect = this.surface.getBoundingClientRect();
    const h = this._unit(rect);
    const touches = [...event.touches].slice(0, 10).map((t) => ({
      id: t.identifier, x: (t.clientX - rect.left) / h, y: (t.clientY - rect.top) / h,
    }));
    this._send({ type: 'touch', action, touches }, event.timeStamp);
  }

  _pollGamepad() {
    cancelAnimationFrame(this._gamepadFrame);
    const pad = [...navigator.getGamepads()].find((p) => p && p.connected);
    if (!pad) { this._sendPad([], []); return; }
    const q = (v) => Math.round(v / GAMEPAD_STEP) * GAMEPAD_STEP;
    const axes = pad.axes.slice(0, 8).map(q);
    const buttons = pad.buttons.slice(0, 32).map((b) => q(b.value));
    this._sendPad(axes, buttons);
    this._gamepadFrame = requestAnimationFrame(() => this._pollGamepad());
  }

  _sendPad(axes, buttons) {
    const key = JSON.stringify([axes, buttons]);
    if (key === this._lastPad) return;  // only changes travel
    this._lastPad = key;
    this.stream.sendInput({ type: 'gamepad', axes, buttons });
  }
}
