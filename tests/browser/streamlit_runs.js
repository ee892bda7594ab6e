// Installed in every test page before Streamlit's own scripts (tests/browser/conftest.py):
// follows the app's runs on its WebSocket so that `settle(page)` knows when the page is final.
//
// The DOM alone cannot say so. Between a click and the server's answer the page still reads
// "notRunning" with the old elements; and when a script calls st.rerun() the server reports the run
// as finished (FINISHED_EARLY_FOR_RERUN) and not running, then starts the next one: for a moment the
// page shows the run before's elements, unmarked, beside the new ones. So this counts the run
// requests the page sends (BackMsg.rerun_script) and the runs the server starts (ForwardMsg.new_session)
// and ends (ForwardMsg.script_finished), reading only the top-level protobuf fields.
(() => {
  if (window.__overruleRuns) return;
  const FORWARD_NEW_SESSION = 4; // ForwardMsg.new_session: a run (or fragment run) started
  const FORWARD_SCRIPT_FINISHED = 6; // ForwardMsg.script_finished: ScriptFinishedStatus
  const FINISHED_EARLY_FOR_RERUN = 2; // another run of the same chain follows at once
  const BACK_RERUN_SCRIPT = 11; // BackMsg.rerun_script: the page asks for a run

  const runs = {
    sent: 0, // run requests the page sent
    served: 0, // requests sent before the latest run started (that run covers them)
    running: false, // a run started and its chain has not finished
    received: 0, // frames received
    processed: 0, // frames the app has handled and React has drawn (see below)
    candidate: null, // the state seen settled at the previous poll: its frame stamp, a frame drawn since
    inputs: 0, // user input events (a click, a key, typed text) the page received
    inputsSent: 0, // of those, the ones after which anything they made Streamlit send has been sent
  };

  // Streamlit does not send a widget's change at once: it batches the changes of one event and sends
  // them from a timer (`WidgetStateManager.scheduleFlush`, a setTimeout of 0). Until that timer has
  // run, the page still reads settled with the old elements, and on a busy machine a poll can come
  // first: `settle` returned before the click's run had even been asked for. So every input event is
  // counted when it starts (capture phase, before any handler of the page), and counted as sent only
  // after two timers in a row: the first is queued before the handlers run, the second after the
  // handlers queued theirs, and timers of equal delay run in the order they were queued.
  const INPUT_EVENTS = ["pointerdown", "pointerup", "mousedown", "mouseup", "click", "keydown", "keyup", "input", "change"];
  const onInput = () => {
    const n = ++runs.inputs;
    setTimeout(() => setTimeout(() => { runs.inputsSent = Math.max(runs.inputsSent, n); }, 0), 0);
  };
  for (const type of INPUT_EVENTS) window.addEventListener(type, onInput, { capture: true });

  function* topLevelFields(bytes) {
    let i = 0;
    const varint = () => {
      let value = 0;
      let scale = 1;
      let byte;
      do {
        byte = bytes[i++];
        value += (byte & 0x7f) * scale;
        scale *= 128;
      } while (byte & 0x80 && i < bytes.length);
      return value;
    };
    while (i < bytes.length) {
      const key = varint();
      const field = Math.floor(key / 8);
      const wire = key & 7;
      if (wire === 0) yield [field, varint()];
      else if (wire === 2) {
        const length = varint();
        yield [field, null];
        i += length;
      } else if (wire === 1) i += 8;
      else if (wire === 5) i += 4;
      else return;
    }
  }

  const asBytes = (data) =>
    data instanceof ArrayBuffer
      ? new Uint8Array(data)
      : ArrayBuffer.isView(data)
        ? new Uint8Array(data.buffer, data.byteOffset, data.byteLength)
        : null;

  const NativeWebSocket = window.WebSocket;
  class TrackedWebSocket extends NativeWebSocket {
    constructor(...args) {
      super(...args);
      // Registered before Streamlit's own handler, so it sees each frame first.
      this.addEventListener("message", (event) => {
        const bytes = asBytes(event.data);
        if (!bytes) return;
        runs.received += 1;
        const seq = runs.received;
        for (const [field, value] of topLevelFields(bytes)) {
          if (field === FORWARD_NEW_SESSION) {
            runs.running = true;
            runs.served = runs.sent;
          } else if (field === FORWARD_SCRIPT_FINISHED && value !== FINISHED_EARLY_FOR_RERUN) {
            runs.running = false;
          }
        }
        // Streamlit handles the frame in this same task (its decoding only awaits resolved promises)
        // and React renders the state it set in a task it posts on a MessageChannel. A message posted
        // from a later task runs after that render: then the frame is on screen.
        setTimeout(() => {
          const channel = new MessageChannel();
          channel.port1.onmessage = () => {
            runs.processed = Math.max(runs.processed, seq);
            channel.port1.close();
          };
          channel.port2.postMessage(null);
        }, 0);
      });
    }

    send(data) {
      const bytes = asBytes(data);
      if (bytes) {
        for (const [field] of topLevelFields(bytes)) {
          if (field === BACK_RERUN_SCRIPT) runs.sent += 1;
        }
      }
      return super.send(data);
    }
  }
  window.WebSocket = TrackedWebSocket;

  // Why the page is not settled yet (null when it is): the answer `settle` waits for and reports.
  runs.pending = () => {
    const app = document.querySelector('[data-testid="stApp"]');
    if (!app) return "no Streamlit app in the page";
    const connection = app.getAttribute("data-test-connection-state");
    if (connection !== "CONNECTED") return `connection ${connection}`;
    if (runs.inputsSent < runs.inputs) return "an input's widget changes are not sent yet";
    if (runs.sent === 0) return "the page has not asked for a run yet";
    if (runs.served < runs.sent) return "a run was asked for and has not started";
    if (runs.running) return "a run is going (or the next run of an st.rerun chain)";
    if (runs.processed < runs.received) return "the last messages are not drawn yet";
    const state = app.getAttribute("data-test-script-state");
    if (state !== "notRunning") return `script state ${state}`;
    if (document.querySelector('[data-stale="true"]')) return "elements of an earlier run are still shown";
    if (document.querySelector('[data-testid="stStatusWidgetRunningIcon"], [data-testid="stStatusWidgetRunningManIcon"]'))
      return "the running indicator is shown";
    if (document.querySelector('[data-testid="stSkeleton"]')) return "an element is still loading";
    return null;
  };

  // Settled: nothing pending at two polls in a row, with no frame received and an animation frame
  // drawn in between. `settle` polls on a timer, not on every animation frame: a poll per frame kept
  // the renderer drawing at 60 Hz for as long as the server worked. The frame counted is one asked
  // for at the first of the two polls, so it is drawn after that poll (its rendering runs in the
  // same task as its callback, before the next poll).
  runs.settled = () => {
    if (runs.pending() !== null) {
      runs.candidate = null;
      return false;
    }
    const stamp = runs.received;
    if (runs.candidate?.stamp === stamp) return runs.candidate.drawn;
    const candidate = { stamp, drawn: false };
    runs.candidate = candidate;
    requestAnimationFrame(() => {
      candidate.drawn = true;
    });
    return false;
  };

  window.__overruleRuns = runs;
})();
