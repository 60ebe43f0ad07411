// Skald memory for SillyTavern: the logic, free of SillyTavern imports so plain node can test it.
//
// SillyTavern's chat is an array of messages {name, is_user, is_system, mes, send_date}.
// A turn is the run of messages that ends with a character's reply; its turn_id is the index
// of that reply in the chat, so the same reply keeps its id through swipes and edits. The
// sidecar (python -m flows.dialogue serve) is called through its HTTP API:
//   memory/query          before a generation: memory for the pending user message(s)
//   turn/replace          a turn whose text memory does not hold yet (new, swiped, edited): an
//                         unchanged turn is an idempotent replay, a changed one is rewound
//                         exactly (with every later turn) and committed again
//   conversation/rewind   turns memory holds that the chat lost (deleted messages)
//   conversation/forget   a chat SillyTavern deleted (the `forgetDeletedChats` option, on by
//                         default): everything memory holds of it, once its writer has stopped;
//                         kept in the host's storage until it lands, so a reload resends it
//   conversation/rename   a chat SillyTavern renamed: its memory moves to the new name. A
//                         renamed chat is another chat id, and SillyTavern emits no event for
//                         it; the chat's metadata does survive the rename, so the id memory
//                         was written under is kept there (`host.getChatMemory`), and a chat
//                         whose recorded id is not its own while no chat of that id exists any
//                         more (`host.chatExists`) was renamed. A branch or a checkpoint copies
//                         the metadata too, but its parent still exists:
//   conversation/copy     a branched chat (or a checkpoint): its parent's memory is copied to
//                         it, and the writer rewinds the turns the branch does not have, with
//                         no LLM call for the turns they share.
//   conversations/{id}/turns   what memory holds, read once per chat (after a reload too)
//   conversation/{id}/lorebook the chat's memory as a World Info book (the `chatLorebook`
//                         option, off by default): fetched after the writer has landed every
//                         write, and handed to the host (`host.offerLorebook`) to save and bind
//                         as the chat's lorebook. Never awaited by an event handler or by the
//                         memory query: a slow or failing lorebook never holds the chat up.
//
// Never blocking the chat: SillyTavern awaits its event handlers (eventSource.emit) before it
// shows the send button again, so the handlers only `kick` a per-chat writer and return. The
// writer compares the chat with what memory holds (`synced`: turn id -> text) and sends, in
// order, one write at a time, until both agree; every change in the chat (a reply, a swipe, an
// edit, a delete) is picked up by the next comparison, so nothing is queued twice and nothing
// is lost: a failed write is retried with backoff (or at once: `retryNow`, the badge's click),
// and after a reload the comparison starts from what the sidecar holds.
//
// The memory query (awaited by SillyTavern before the prompt is built) waits only for writes
// that change what it would recall (a rewrite or removal of a turn memory holds), and only up
// to `waitBoundMs`; then it sends the still-pending turns as `pending_turns`, and the sidecar
// leaves their old text out. A new turn's commit is never waited for: its text is in the
// prompt's chat history already.

export const STATUSES = Object.freeze(['idle', 'syncing', 'committed', 'nothing_new', 'rollback', 'error']);
export const STATUS_LABELS = Object.freeze({ nothing_new: 'nothing new' });
export const PROMPT_KEY = 'skald_memory';
// SillyTavern's extension_prompt_types (public/script.js): IN_PROMPT = 0, IN_CHAT = 1, BEFORE_PROMPT = 2.
export const PROMPT_POSITION_IN_PROMPT = 0;
// The window (the chat before the pending messages, which the prompt holds too) when the
// prompt's size is not known: its last 12 messages. When it is (SillyTavern's interceptor gives
// the context's size), the messages that fit (`promptWindow`), at most the sidecar's limit on a
// request's messages and well inside its limit on a body (320 KB, pending turns beside them).
export const WINDOW_MESSAGES = 12;
export const MAX_WINDOW_MESSAGES = 200;
// The window at most, in bytes as the request's JSON carries its messages (UTF-8, escapes,
// names and times: `messageBytes`).
export const MAX_WINDOW_BYTES = 96 * 1024;
// The sidecar's limit on a request's body (tasks.dialogue.models.MAX_BODY_BYTES), and what a
// query's parts may take of it: the pending turns' texts (`pendingTurns`), the pending messages
// and the window together, and 8 KB for the request's other fields.
export const MAX_BODY_BYTES = 320 * 1024;
export const MAX_PENDING_TURN_BYTES = 32 * 1024;
export const MAX_QUERY_TEXT_BYTES = MAX_BODY_BYTES - MAX_PENDING_TURN_BYTES - 8 * 1024;
// The sidecar's limit on one message (tasks.dialogue.models.MAX_MESSAGE_CHARS, in characters).
// A longer message (a pasted text) is sent as its first this many, so its turn is remembered and
// the queries that show it are answered: refused whole, it was neither.
export const MAX_MESSAGE_CHARS = 64 * 1024;
// Of the context the interceptor is given (its size less the reply's), what is kept for the
// parts of the prompt the extension cannot read: the system prompt and instruct sequences, the
// persona, World Info (its default budget is a quarter of the context). Too much kept only
// makes the window shorter, and memory then may repeat a message the prompt shows; too little
// would hide from memory a message the prompt has already cut.
export const PROMPT_RESERVE_SHARE = 0.25;
export const PROMPT_RESERVE_TOKENS = 300;
// A message's name and separators in the prompt.
const MESSAGE_OVERHEAD_TOKENS = 4;
export const PAGE_LIMIT = 500;
// From this many turns to write (an old chat met, a long outage), the writer imports the older
// ones in bulk as text (`importHistory`; POST conversation/import: no LLM slot, so no facts),
// all but the newest IMPORT_KEEP_TURNS, which go through the LLM slots as every turn does; with
// the import off, the badge names the bulk import of the chat's file instead.
export const IMPORT_HINT_TURNS = 50;
export const IMPORT_KEEP_TURNS = 20;
export const MAX_PENDING_TURNS = 200;

// The sidecar's bounds for the two numbers a user may set (TurnConfig: token_budget, recall_k).
export const TOKEN_BUDGET_RANGE = Object.freeze([64, 32768]);
export const RECALL_K_RANGE = Object.freeze([0, 50]);

/** A number typed into a setting: a whole number inside [min, max] (the nearest bound when
 *  outside), or `fallback` when it is no number at all, so the sidecar never refuses it. */
export function boundedSetting(value, [min, max], fallback) {
    const number = Math.round(Number(String(value).trim()));
    if (String(value).trim() === '' || !Number.isFinite(number)) return fallback;
    return Math.min(max, Math.max(min, number));
}

export const DEFAULT_SETTINGS = Object.freeze({
    enabled: true,
    baseUrl: 'http://127.0.0.1:8787',
    token: '',
    tokenBudget: 1024,
    recallK: 5,
    requireActions: true,
    // How long a memory query waits for a pending rewrite (edit, swipe, delete) to land before
    // it asks anyway, holding the rewritten turns' old text back (see the README for the
    // measurement behind it).
    waitBoundMs: 1500,
    retryBaseMs: 1000,
    retryMaxMs: 30000,
    // Offer the chat's memory to SillyTavern as the chat's lorebook (World Info), refreshed
    // whenever memory has caught up with the chat.
    chatLorebook: false,
    // Forget a chat's memory when SillyTavern deletes the chat: memory holds its words, and a
    // deleted chat should not live on in the graph.
    forgetDeletedChats: true,
    // A chat IMPORT_HINT_TURNS or more turns behind memory has its older turns imported at once
    // as text (no facts) instead of through the LLM slots one by one (seconds to minutes each).
    importHistory: true,
});

/** The World Info book name for a chat's memory: SillyTavern's own chat-book naming
 *  (/getchatbook: non-alphanumerics to "_", at most 64 characters), with a digest of the full
 *  chat id so two long ids sharing a prefix get two books. */
export function lorebookName(chatId) {
    const id = String(chatId);
    let hash = 0x811c9dc5; // FNV-1a, 32 bits
    for (let i = 0; i < id.length; i++) {
        hash ^= id.charCodeAt(i);
        hash = Math.imul(hash, 0x01000193) >>> 0;
    }
    const readable = `Skald memory ${id}`.replace(/[^a-z0-9]/gi, '_').replace(/_{2,}/g, '_').substring(0, 55);
    return `${readable}_${hash.toString(16).padStart(8, '0')}`;
}

// Half of a character written as two UTF-16 units, with no other half beside it.
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

/** A message's text as the sidecar takes it: half characters (a JavaScript string may hold
 *  them; JSON then carries a "\ud800" the sidecar refuses as no text) as U+FFFD, and within
 *  its limit (MAX_MESSAGE_CHARS): its start, without half of a character at the cut (a
 *  string's length counts UTF-16 units, never fewer than the sidecar's characters). */
export function clipContent(text) {
    const whole = text.replace(LONE_SURROGATE, '\uFFFD');
    if (whole.length <= MAX_MESSAGE_CHARS) return whole;
    const last = whole.charCodeAt(MAX_MESSAGE_CHARS - 1);
    return whole.slice(0, last >= 0xd800 && last <= 0xdbff ? MAX_MESSAGE_CHARS - 1 : MAX_MESSAGE_CHARS);
}

/** The bytes a value (a text, a message) takes as JSON in a request body (UTF-8, quotes and
 *  escapes). */
export function jsonBytes(value) {
    let bytes = 0;
    for (const char of JSON.stringify(value ?? '')) {
        const code = char.codePointAt(0);
        bytes += code < 0x80 ? 1 : code < 0x800 ? 2 : code < 0x10000 ? 3 : 4;
    }
    return bytes;
}

/** The bytes a message takes in a request's list of them (its JSON and a comma). */
export function messageBytes(message) {
    return jsonBytes(message) + 1;
}

// A message's JSON with every field empty, and a comma.
const EMPTY_MESSAGE_BYTES = messageBytes({ role: '', content: '', message_id: '', name: '', time: '' });

/** At least `messageBytes(message)`, from the lengths alone: JSON writes a UTF-16 unit in six
 *  bytes at most (a control character as "\u001f"). */
function messageBytesAtMost(message) {
    const units = [message.role, message.content, message.message_id, message.name, message.time]
        .reduce((sum, field) => sum + (field?.length ?? 0), 0);
    return EMPTY_MESSAGE_BYTES + 6 * units;
}

/** The sidecar's message form of one SillyTavern message, or null for system notes. */
export function toSidecarMessage(message, index) {
    if (!message || message.is_system) return null;
    const out = {
        role: message.is_user ? 'user' : 'assistant',
        content: clipContent(String(message.mes ?? '')),
        message_id: String(index),
    };
    if (message.name) out.name = clipContent(String(message.name)).slice(0, 200).replace(LONE_SURROGATE, '');
    if (message.send_date) out.time = String(message.send_date).slice(0, 200);
    return out;
}

/** A turn's text as memory holds it (the sidecar's turn_text): `speaker: content` lines. */
export function turnText(messages) {
    return messages.map((m) => `${m.name || m.role}: ${m.content}`).join('\n');
}

/** The newest of `messages` that one request's body takes beside its other fields: at most
 *  the sidecar's 200 messages and MAX_QUERY_TEXT_BYTES, the newest always. */
export function newestThatFit(messages) {
    // Counting bytes reads every character, and turnsOf runs before each generation and each
    // write: when a bound that needs no reading fits, every message is kept as it would be.
    if (messages.length <= MAX_WINDOW_MESSAGES
        && messages.reduce((sum, m) => sum + messageBytesAtMost(m), 0) <= MAX_QUERY_TEXT_BYTES) {
        return messages;
    }
    const kept = [];
    let room = MAX_QUERY_TEXT_BYTES;
    for (let i = messages.length - 1; i >= 0 && kept.length < MAX_WINDOW_MESSAGES; i--) {
        room -= messageBytes(messages[i]);
        if (room < 0 && kept.length) break;
        kept.unshift(messages[i]);
    }
    return kept;
}

/** Turns of a chat: [{turnId, first, last, messages, text}], each ending with a character's
 *  reply. Trailing user messages without a reply are not a turn yet (they are pending). A
 *  turn holds the newest of its messages that a write's body takes (`newestThatFit`): a turn
 *  of several pasted texts before one reply was refused whole, and so never remembered. */
export function turnsOf(chat) {
    const turns = [];
    let start = 0;
    let messages = [];
    chat.forEach((message, index) => {
        const converted = toSidecarMessage(message, index);
        if (converted === null) return;
        if (converted.content.trim() === '') return;
        messages.push(converted);
        if (converted.role === 'assistant') {
            messages = newestThatFit(messages);
            turns.push({ turnId: index, first: start, last: index, messages, text: turnText(messages) });
            messages = [];
            start = index + 1;
        }
    });
    return turns;
}

/** Tokens of a text, counted high rather than low (no tokenizer: SillyTavern's differs by
 *  model and version): three characters of ASCII a token (English runs about four), any
 *  other character a token of its own. */
export function estimateTokens(text) {
    let ascii = 0;
    let other = 0;
    for (const char of text ?? '') {
        if (char.codePointAt(0) < 128) ascii += 1;
        else other += 1;
    }
    return Math.ceil(ascii / 3) + other;
}

/** The tokens a prompt of `contextSize` tokens has for the chat's messages: less the reserve,
 *  what else it holds that the extension can read (`extraText`: the character card, other
 *  extensions' prompts; null: not known) and memory's own packet (`tokenBudget`). null: the
 *  room is unknown. */
export function chatTokens(contextSize, extraText, tokenBudget) {
    if (!Number.isFinite(contextSize) || contextSize <= 0 || extraText === null) return null;
    const reserve = Math.ceil(contextSize * PROMPT_RESERVE_SHARE) + PROMPT_RESERVE_TOKENS;
    return Math.max(0, contextSize - reserve - estimateTokens(extraText) - (tokenBudget || 0));
}

/** The last of `messages` (the chat before `pending`) that the prompt holds beside the pending
 *  ones: from the newest back, while they fit `tokens` (`chatTokens`), as SillyTavern fills
 *  its prompt; null tokens: the last WINDOW_MESSAGES. Either way no more text than the
 *  sidecar's body takes beside the pending ones (MAX_WINDOW_BYTES, MAX_QUERY_TEXT_BYTES). */
export function promptWindow(messages, pending, tokens) {
    const known = tokens !== null && tokens !== undefined;
    const most = known ? MAX_WINDOW_MESSAGES : WINDOW_MESSAGES;
    const cost = (m) => estimateTokens(`${m.name || m.role}: ${m.content}`) + MESSAGE_OVERHEAD_TOKENS;
    let used = known ? pending.reduce((sum, m) => sum + cost(m), 0) : 0;
    const pendingBytes = pending.reduce((sum, m) => sum + messageBytes(m), 0);
    let room = Math.min(MAX_WINDOW_BYTES, MAX_QUERY_TEXT_BYTES - pendingBytes);
    let from = messages.length;
    while (from > 0 && messages.length - from < most) {
        const message = messages[from - 1];
        room -= messageBytes(message);
        if (known) used += cost(message);
        if (room < 0 || (known && used > tokens)) break;
        from -= 1;
    }
    return messages.slice(from);
}

/** The pending messages (after the last reply; the newest the query's body takes) and the
 *  window before them (`promptWindow`: `tokens`, the prompt's room for the chat, or null for
 *  the last WINDOW_MESSAGES). */
export function pendingOf(chat, tokens = null) {
    const turns = turnsOf(chat);
    const from = turns.length ? turns[turns.length - 1].last + 1 : 0;
    const unanswered = [];
    for (let i = from; i < chat.length; i++) {
        const converted = toSidecarMessage(chat[i], i);
        if (converted && converted.content.trim() !== '') unanswered.push(converted);
    }
    // The newest of them that a query's body takes: more would have the whole query refused.
    const pending = newestThatFit(unanswered);
    const window = promptWindow(turns.flatMap((t) => t.messages), pending, tokens);
    return { pending, window };
}

/**
 * What is out of step between the chat and memory (`synced`: turn id -> text memory holds).
 * `rewrite`: the first turn memory holds whose text the chat changed or lost (a replace or a
 * rewind removes it and every later turn from memory); `fresh`: turns memory does not hold.
 */
export function divergence(turns, synced, refused = new Map()) {
    const byId = new Map(turns.map((t) => [String(t.turnId), t]));
    const held = [...synced.keys()].sort((a, b) => Number(a) - Number(b));
    let rewrite = null;
    for (const id of held) {
        const turn = byId.get(id);
        if (!turn) {
            rewrite = { kind: 'rewind', turnId: id };
            break;
        }
        if (turn.text !== synced.get(id)) {
            rewrite = { kind: 'replace', turnId: id, turn };
            break;
        }
    }
    const fresh = turns.filter((t) => !synced.has(String(t.turnId)) && refused.get(String(t.turnId)) !== t.text);
    return { rewrite, fresh };
}

export class SidecarError extends Error {
    constructor(message, status, body) {
        super(message);
        this.status = status;
        this.body = body;
    }
}

/** The sidecar's HTTP API (fetch: the browser's, or node's own). */
export class SidecarClient {
    constructor({ baseUrl, token = '', fetchImpl = globalThis.fetch } = {}) {
        this.baseUrl = String(baseUrl || DEFAULT_SETTINGS.baseUrl).replace(/\/+$/, '');
        this.token = token;
        // Called as a plain function: a browser's fetch called as a method of another object
        // throws "Illegal invocation".
        this.fetch = (url, init) => fetchImpl(url, init);
    }

    async call(method, path, body) {
        const headers = { 'Content-Type': 'application/json' };
        if (this.token) headers.Authorization = `Bearer ${this.token}`;
        let response;
        try {
            response = await this.fetch(`${this.baseUrl}/api/kg-sidecar${path}`, {
                method, headers, body: body === undefined ? undefined : JSON.stringify(body),
            });
        } catch (error) {
            throw new SidecarError(`sidecar unreachable at ${this.baseUrl}: ${error.message}`, 0, null);
        }
        let data = null;
        try {
            data = await response.json();
        } catch {
            data = null;
        }
        return { status: response.status, data };
    }

    async health() {
        return this.call('GET', '/health');
    }

    async queryMemory(conversationId, pending, window, config, pendingTurns = []) {
        const body = { conversation_id: conversationId, messages: pending, window, config };
        if (pendingTurns.length) body.pending_turns = pendingTurns;
        return this.call('POST', '/memory/query', body);
    }

    /** turns: [{turn_id, messages}], oldest first. */
    async importTurns(conversationId, turns) {
        return this.call('POST', '/conversation/import', { conversation_id: conversationId, turns });
    }

    async replaceTurn(conversationId, turnId, messages, window, config) {
        return this.call('POST', '/turn/replace', {
            conversation_id: conversationId, turn_id: turnId, messages, window, config,
        });
    }

    async rewind(conversationId, beforeTurn) {
        return this.call('POST', '/conversation/rewind', { conversation_id: conversationId, before_turn: beforeTurn });
    }

    async forget(conversationId) {
        return this.call('POST', '/conversation/forget', { conversation_id: conversationId });
    }

    async rename(conversationId, newConversationId) {
        return this.call('POST', '/conversation/rename', {
            conversation_id: conversationId, new_conversation_id: newConversationId,
        });
    }

    async copy(conversationId, newConversationId) {
        return this.call('POST', '/conversation/copy', {
            conversation_id: conversationId, new_conversation_id: newConversationId,
        });
    }

    async turns(conversationId, offset = 0, limit = PAGE_LIMIT) {
        const id = encodeURIComponent(conversationId);
        return this.call('GET', `/conversations/${id}/turns?offset=${offset}&limit=${limit}`);
    }

    async lorebook(conversationId) {
        return this.call('GET', `/conversation/${encodeURIComponent(conversationId)}/lorebook`);
    }
}

const retryable = (status) => status === 0 || status === 409 || status === 429 || status >= 500;

/** One chat's writer state. */
class ChatState {
    constructor(id) {
        this.id = id;
        this.synced = new Map(); // turn id -> the text memory holds
        this.refused = new Map(); // turn id -> text the sidecar refused as invalid (not retried unchanged)
        this.loaded = false;
        this.running = null; // the writer loop's promise
        this.failure = null; // {reason, attempt, retryAt}
        this.wake = null; // ends a backoff wait early
        this.waiters = new Set();
        this.lorebookStale = false; // memory changed since the lorebook was last offered
        this.lorebookRunning = null; // the lorebook refresh's promise
        this.adopted = false; // the chat's metadata records its id (a rename was looked for)
        this.lorebookName = null; // the chat's lorebook, as its metadata names it
        this.deleted = false; // SillyTavern deleted the chat: no more writes for it
        this.forgetting = null; // the forget's promise
        this.importRefused = false; // the sidecar refused an import (an older one has none): turn by turn
        this.importing = 0; // older turns the writer is importing as text (the badge says so)
    }
}

/**
 * The extension's behaviour over an abstract host: `host.getChat()`, `host.getChatId()`,
 * `host.setPrompt(text)`, `host.onStatus(status, detail, pending)`. Event handlers return at
 * once (`kick`); `beforeGeneration` is what SillyTavern awaits before it builds the prompt.
 */
export class SkaldMemory {
    constructor(host, settings = {}, client = null) {
        this.host = host;
        this.settings = { ...DEFAULT_SETTINGS, ...settings };
        this.client = client ?? new SidecarClient({ baseUrl: this.settings.baseUrl, token: this.settings.token });
        this.status = 'idle';
        this.detail = '';
        this.pending = 0;
        this.lastPacket = null;
        this.lastQuery = null;
        this.outcome = { status: 'idle', detail: '' };
        this.outcomes = []; // every write's outcome, newest last (the last 200): {at, chatId, step, turnId, status, detail}
        this.lastLorebook = null; // the last lorebook refresh: {at, chatId, name, status, entries, detail}
        this.chats = new Map();
    }

    setStatus(status, detail = '') {
        if (!STATUSES.includes(status)) throw new Error(`unknown status ${status}`);
        this.status = status;
        this.detail = detail;
        this.host.onStatus?.(status, detail, this.pending);
    }

    config() {
        return {
            token_budget: this.settings.tokenBudget,
            recall_k: this.settings.recallK,
            require_actions: this.settings.requireActions,
        };
    }

    chatState(id) {
        const key = String(id);
        if (!this.chats.has(key)) this.chats.set(key, new ChatState(key));
        return this.chats.get(key);
    }

    currentChat() {
        const id = this.host.getChatId();
        return id ? this.chatState(id) : null;
    }

    /** Writes the current chat still needs (turns memory does not hold as the chat has them). */
    pendingWrites(state = this.currentChat()) {
        if (!state) return 0;
        if (!state.loaded) return turnsOf(this.host.getChat()).length;
        const turns = turnsOf(this.host.getChat());
        const { rewrite, fresh } = divergence(turns, state.synced, state.refused);
        if (!rewrite) return fresh.length;
        // A rewrite removes its turn and every later one from memory: all of them are written again.
        const from = Number(rewrite.turnId);
        return (rewrite.kind === 'rewind' ? 1 : 0) + turns.filter((t) => t.turnId >= from || !state.synced.has(String(t.turnId))).length;
    }

    /** The badge: what is pending, else what the last write did. */
    showProgress(state = this.currentChat()) {
        this.pending = this.pendingWrites(state);
        if (state?.failure) {
            const seconds = Math.max(0, Math.round((state.failure.retryAt - Date.now()) / 1000));
            this.setStatus('error', `${state.failure.reason}; ${this.pending} pending, retrying in ${seconds}s (click to retry now)`);
        } else if (state?.running && state.importing) {
            this.setStatus('syncing', `${this.pending} pending; importing ${state.importing} older turn(s) `
                + `as text (no facts); the newest ${IMPORT_KEEP_TURNS} go through the LLM slots`);
        } else if (state?.running && this.pending >= IMPORT_HINT_TURNS && !this.importsHistory(state)) {
            // Each of them goes through the LLM slots in turn (seconds to minutes a turn):
            // the chat's file is remembered at once by the sidecar's bulk import, which the writer
            // then finds held (a write already under way lands as the same turn, once).
            this.setStatus('syncing', `${this.pending} pending; to remember them at once, run `
                + `python -m flows.dialogue ingest --dialogue "${state.id}.jsonl" (the chat's file) `
                + 'on the sidecar\'s project');
        } else if (state?.running && this.pending > 0) {
            this.setStatus('syncing', `${this.pending} pending`);
        } else {
            this.setStatus(this.outcome.status, this.outcome.detail);
        }
    }

    /** Something changed in the chat (a reply, a swipe, an edit, a delete, another chat):
     *  start the current chat's writer if it is not running. Returns at once. */
    kick() {
        if (!this.settings.enabled) return null;
        const state = this.currentChat();
        if (!state) return null;
        if (!state.running) {
            state.running = this.writer(state).finally(() => {
                state.running = null;
                this.notify(state);
                if (this.currentChat() === state) this.showProgress(state);
                this.refreshLorebook(state);
            });
        }
        this.showProgress(state);
        return state.running;
    }

    /** Retry failed writes now (the badge's click). */
    retryNow() {
        for (const state of this.chats.values()) {
            if (state.wake) state.wake();
            state.importRefused = false; // the settings may point at another sidecar now
        }
        return this.kick();
    }

    /** Resolves when every write the current chat needs has landed (tests, the reload check). */
    async settled() {
        for (;;) {
            const state = this.currentChat();
            if (!state?.running) return;
            await state.running;
        }
    }

    notify(state) {
        for (const wake of state.waiters) wake();
        state.waiters.clear();
    }

    changed(state) {
        return new Promise((resolve) => state.waiters.add(resolve));
    }

    /** The wait before retry `attempt` (1, 2, ...): retryBaseMs doubling up to retryMaxMs. */
    retryDelay(attempt) {
        return Math.min(this.settings.retryMaxMs, this.settings.retryBaseMs * 2 ** (attempt - 1));
    }

    async backoff(state, reason) {
        const attempt = (state.failure?.attempt ?? 0) + 1;
        const delay = this.retryDelay(attempt);
        state.failure = { reason, attempt, retryAt: Date.now() + delay };
        this.showProgress(state);
        this.notify(state);
        await pause(state, delay);
    }

    async load(state) {
        const synced = new Map();
        for (let offset = 0; ; offset += PAGE_LIMIT) {
            const { status, data } = await this.client.turns(state.id, offset, PAGE_LIMIT);
            if (status !== 200 || !Array.isArray(data?.items)) {
                throw new SidecarError(data?.reason ?? `reading memory's turns failed (HTTP ${status})`, status, data);
            }
            for (const item of data.items) synced.set(String(item.turn_id), item.text);
            if (data.items.length < PAGE_LIMIT || offset + PAGE_LIMIT >= data.page.total) break;
        }
        state.synced = synced;
        state.loaded = true;
        state.lorebookStale = true;
    }

    /** Before a chat's memory is first read: if its metadata records another id, the chat was
     *  renamed (no chat of that id exists any more: its memory is moved to the chat's id) or
     *  branched (that chat still exists: its memory is copied, and the writer then rewinds
     *  what the branch does not have). Then the chat's id is recorded in its metadata
     *  (`host.getChatMemory()`, `host.setChatMemory(record)`: `{conversation_id, lorebook,
     *  owner}`, the owner being the character or group the chat belongs to, `host.getChatOwner()`;
     *  a record of another owner's chat, as an imported chat file carries, is only copied).
     *  A failure to reach the sidecar throws (the writer retries with backoff); a refusal is
     *  recorded and the chat goes on under its own id.
     *
     *  The record also names the chat's lorebook, so a renamed chat keeps writing the book it
     *  is bound to (the binding moves with the metadata), while a branch, bound to its
     *  parent's book by the copied metadata, gets a book of its own. */
    async adopt(state) {
        const record = this.host.getChatMemory?.() ?? null;
        const recorded = record?.conversation_id ?? null;
        if (!this.host.setChatMemory) {
            state.adopted = true;
            return;
        }
        const owner = this.host.getChatOwner?.() ?? null;
        let lorebook = lorebookName(state.id);
        if (recorded === state.id) lorebook = record.lorebook ?? lorebook;
        else if (recorded && this.host.chatExists) {
            // A chat imported from another character or group names a chat that is not this
            // one's to take: its memory is copied, never moved.
            const elsewhere = Boolean(record.owner && owner && record.owner !== owner);
            if (elsewhere || await this.host.chatExists(recorded)) {
                await this.carryOver(state, 'copy', recorded);
            } else {
                const previous = this.chats.get(recorded);
                if (previous?.running) await previous.running;
                await this.carryOver(state, 'rename', recorded);
                this.chats.delete(recorded);
                lorebook = record.lorebook ?? lorebookName(recorded);
            }
        }
        // Only into the chat's own metadata: another chat may have been opened meanwhile (then
        // this runs again when the chat is next written).
        if (String(this.host.getChatId() ?? '') !== state.id) return;
        if (recorded !== state.id || record.lorebook !== lorebook || (owner && record.owner !== owner)) {
            await this.host.setChatMemory({ conversation_id: state.id, lorebook, ...(owner ? { owner } : {}) });
        }
        state.lorebookName = lorebook;
        state.adopted = true;
    }

    /** The memory of chat `from` moved ('rename') or copied ('copy') to this chat's id. A copy
     *  the chat already holds memory for is no error: it landed before (the record was not
     *  saved then). */
    async carryOver(state, kind, from) {
        const step = { kind, turnId: null };
        const what = kind === 'rename' ? 'renamed chat' : 'branched chat';
        const { status, data } = await this.client[kind](from, state.id);
        if (status === 200 && data?.ok) {
            const done = kind === 'rename' ? 'moved' : 'copied';
            const detail = data.found
                ? `${what}: ${data[done].memory} remembered turn(s) ${done} from "${from}"`
                : `${what}: memory held nothing of "${from}"`;
            this.record(state, step, 'idle', detail);
        } else if (kind === 'copy' && data?.error_kind === 'conflict') {
            this.record(state, step, 'idle', `${what}: memory of it is there already`);
        } else if (retryable(status) && data?.error_kind !== 'conflict') {
            throw new SidecarError(data?.reason ?? `${kind} failed (HTTP ${status})`, status, data);
        } else {
            this.record(state, step, 'error', `${what}: ${data?.reason ?? `HTTP ${status}`}`);
        }
    }

    /** One chat's writes, in order, one at a time, until memory holds the chat as it is. */
    async writer(state) {
        while (this.settings.enabled && !state.deleted && String(this.host.getChatId() ?? '') === state.id) {
            try {
                if (!state.adopted) await this.adopt(state);
                if (!state.loaded) {
                    await this.load(state);
                    state.failure = null;
                    this.notify(state);
                    continue;
                }
                const turns = turnsOf(this.host.getChat());
                const { rewrite, fresh } = divergence(turns, state.synced, state.refused);
                const step = rewrite ?? this.importBatch(state, fresh)
                    ?? (fresh.length ? { kind: 'commit', turnId: String(fresh[0].turnId), turn: fresh[0] } : null);
                if (!step) {
                    state.importing = 0;
                    return;
                }
                state.importing = step.kind === 'import' ? fresh.length - IMPORT_KEEP_TURNS : 0;
                this.showProgress(state);
                const run = { rewind: this.rewindStep, import: this.importStep }[step.kind] ?? this.writeStep;
                const ok = await run.call(this, state, step, turns);
                if (ok) state.failure = null;
            } catch (error) {
                const status = error instanceof SidecarError ? error.status : 0;
                if (!retryable(status)) {
                    this.outcome = { status: 'error', detail: error.message };
                    state.failure = null;
                    return;
                }
                await this.backoff(state, error.message);
                continue;
            }
            this.notify(state);
            this.showProgress(state);
        }
    }

    record(state, step, status, detail) {
        this.outcome = { status, detail };
        this.outcomes.push({ at: Date.now(), chatId: state.id, step: step.kind, turnId: step.turnId, status, detail });
        if (this.outcomes.length > 200) this.outcomes.shift();
    }

    forgetFrom(state, turnId, inclusive = true) {
        for (const id of [...state.synced.keys()]) {
            if (Number(id) > Number(turnId) || (inclusive && Number(id) === Number(turnId))) state.synced.delete(id);
        }
    }

    async rewindStep(state, step) {
        const { status, data } = await this.client.rewind(state.id, step.turnId);
        if (status === 200 && data?.ok) {
            this.forgetFrom(state, step.turnId);
            state.lorebookStale = true;
            this.record(state, step, 'idle', `rewound ${data.removed_turns.length} turn(s) from turn ${step.turnId}`);
            return true;
        }
        if (retryable(status)) throw new SidecarError(data?.reason ?? `rewind failed (HTTP ${status})`, status, data);
        // Refused (e.g. a conversation committed before rewinds existed): memory keeps those turns.
        this.forgetFrom(state, step.turnId);
        this.record(state, step, 'error', data?.reason ?? `rewind refused (HTTP ${status})`);
        return true;
    }

    importsHistory(state) {
        return this.settings.importHistory && !state.importRefused;
    }

    /** The next import (`importHistory`): when IMPORT_HINT_TURNS or more turns are fresh, the
     *  oldest of them, all but the newest IMPORT_KEEP_TURNS, as many as one body takes (each
     *  turn fits one already: `newestThatFit`). null: nothing to import. */
    importBatch(state, fresh) {
        if (!this.importsHistory(state) || fresh.length < IMPORT_HINT_TURNS) return null;
        const turns = [];
        let room = MAX_QUERY_TEXT_BYTES;
        for (const turn of fresh.slice(0, fresh.length - IMPORT_KEEP_TURNS)) {
            room -= turn.messages.reduce((sum, m) => sum + messageBytes(m), 0);
            if (turns.length >= MAX_PENDING_TURNS || (room < 0 && turns.length)) break;
            turns.push(turn);
        }
        return { kind: 'import', turnId: String(turns[0].turnId), turns };
    }

    async importStep(state, step) {
        const body = step.turns.map((t) => ({ turn_id: t.turnId, messages: t.messages }));
        const { status, data } = await this.client.importTurns(state.id, body);
        if (status === 200 && data?.ok) {
            const byId = new Map(step.turns.map((t) => [String(t.turnId), t]));
            for (const id of data.added) {
                state.synced.set(id, byId.get(id).text);
                state.refused.delete(id);
            }
            // Turns memory held already (written meanwhile, or by an import of the chat's file):
            // what it holds of them is read again, and any that differs is rewritten.
            if (data.already.length) state.loaded = false;
            state.lorebookStale = true;
            const ids = step.turns.map((t) => t.turnId);
            this.record(state, step, 'committed', `imported turns ${ids[0]}-${ids.at(-1)} as text (no facts): `
                + `${data.added.length} added${data.already.length ? `, ${data.already.length} held already` : ''}`);
            return true;
        }
        if (retryable(status)) {
            throw new SidecarError(data?.reason ?? `import failed (HTTP ${status})`, status, data);
        }
        // Refused (a sidecar without the import answers 404): the turns are written one by one.
        state.importRefused = true;
        this.record(state, step, 'error', `import refused, writing turn by turn: ${data?.reason ?? `HTTP ${status}`}`);
        return true;
    }

    async writeStep(state, step, turns) {
        const { turn } = step;
        // The last messages before it, no more than the body takes beside the turn's own.
        const window = promptWindow(turns.filter((t) => t.last < turn.first).flatMap((t) => t.messages), turn.messages, null);
        const { status, data } = await this.client.replaceTurn(state.id, turn.turnId, turn.messages, window, this.config());
        const id = String(turn.turnId);
        if (status === 200 && (data?.committed || data?.state === 'ROLLED_BACK')) {
            // A replaced turn rewinds every later one in memory: they are written again next.
            if (step.kind === 'replace') this.forgetFrom(state, id, false);
            state.synced.set(id, turn.text);
            state.refused.delete(id);
            state.lorebookStale = true;
            if (data.committed) {
                this.record(state, step, 'committed', `turn ${id}${data.idempotent_hit ? ' (already held)' : ''}`);
            } else if (data.nothing_new) {
                this.record(state, step, 'nothing_new', `turn ${id}: remembered as text; no relation to record`);
            } else {
                this.record(state, step, 'rollback', `turn ${id}: ${data.reason ?? 'held back by the commit gate'}`);
            }
            return true;
        }
        if (retryable(status)) throw new SidecarError(data?.reason ?? `commit failed (HTTP ${status})`, status, data);
        state.refused.set(id, turn.text);
        this.record(state, step, 'error', `turn ${id} refused: ${data?.reason ?? `HTTP ${status}`}`);
        return true;
    }

    /** Turns the sidecar may hold differently from the chat, as `pending_turns`: [{turn_id,
     *  text}], text being what memory will hold, or null. A chat catching up lists every turn
     *  memory lacks (up to MAX_PENDING_TURNS): their texts would outgrow the body (200 turns
     *  of 2 KB had every query refused as too large), so texts go in from the newest turn back
     *  while MAX_PENDING_TURN_BYTES lasts, and the others go as null, which the sidecar
     *  holds back as a turn being removed (it recalls none of their text until the write lands;
     *  a turn it does not hold yet it has nothing of to hold back). */
    pendingTurns(state, turns, regenerating) {
        const out = new Map();
        if (!state.loaded) {
            for (const t of turns) out.set(String(t.turnId), t.text);
        } else {
            for (const t of turns) {
                if (state.synced.get(String(t.turnId)) !== t.text) out.set(String(t.turnId), t.text);
            }
            for (const id of state.synced.keys()) {
                if (!turns.some((t) => String(t.turnId) === id)) out.set(id, null);
            }
        }
        if (regenerating !== null) out.set(String(regenerating), null);
        const listed = [...out.entries()].slice(-MAX_PENDING_TURNS).map(([turn_id]) => ({ turn_id, text: null }));
        let room = MAX_PENDING_TURN_BYTES - listed.reduce((sum, entry) => sum + jsonBytes(entry) + 1, 0);
        for (let i = listed.length - 1; i >= 0; i--) {
            const text = out.get(listed[i].turn_id);
            if (text === null) continue;
            const more = jsonBytes({ ...listed[i], text }) - jsonBytes(listed[i]);
            if (more > room) continue;
            listed[i].text = text;
            room -= more;
        }
        return listed;
    }

    rewriting(state, regenerating) {
        if (!state.loaded) return true;
        const turns = turnsOf(this.host.getChat());
        const { rewrite } = divergence(turns, state.synced, state.refused);
        if (rewrite) return true;
        return regenerating !== null && state.synced.has(String(regenerating));
    }

    /** What the prompt holds beside the chat (`host.promptExtras`), or null when the host
     *  cannot tell (a SillyTavern whose context lacks what it reads): the window is then the
     *  last WINDOW_MESSAGES, and memory is still asked. */
    promptExtras() {
        try {
            const extras = this.host.promptExtras?.() ?? '';
            return typeof extras === 'string' ? extras : null;
        } catch {
            return null;
        }
    }

    /** Before a generation: put memory for the pending message(s) into the prompt.
     *  `promptChat`: the chat SillyTavern builds the prompt from (its interceptor argument:
     *  system notes left out, and the reply being swiped left out); `contextSize`: the
     *  prompt's size in tokens, less the reply's (the interceptor's second argument). Memory
     *  leaves last the turns the prompt holds whole: the window is what fits of the chat. */
    async beforeGeneration(promptChat = null, contextSize = null) {
        if (!this.settings.enabled) return null;
        const state = this.currentChat();
        const chat = this.host.getChat();
        if (!state) {
            this.host.setPrompt('');
            return null;
        }
        const all = turnsOf(chat);
        // A swipe regenerates the last reply: the prompt's chat lacks it, the chat still has it.
        const visible = chat.filter((m) => m && !m.is_system);
        const last = all[all.length - 1];
        const regenerating = promptChat && last && promptChat.length === visible.length - 1 && last.last === chat.length - 1
            ? last.turnId : null;
        const base = regenerating !== null ? chat.slice(0, last.last) : chat;
        const tokens = chatTokens(contextSize, this.promptExtras(), this.settings.tokenBudget);
        const { pending, window } = pendingOf(base, tokens);
        // Nothing pending (a Continue of the last reply, or a generation before anyone wrote):
        // memory is asked about the chat's last message. The window holds it too, so its own turn
        // is not what memory brings back.
        const asked = pending.length ? pending : window.slice(-1);
        if (asked.length === 0) {
            this.host.setPrompt('');
            return null;
        }
        this.kick();
        const started = Date.now();
        // Wait for writes that change what this query would recall, up to the bound.
        // (Not while the writer is failing: the sidecar is down, waiting would only delay the reply.)
        while (state.running && !state.failure && this.rewriting(state, null)
            && Date.now() - started < this.settings.waitBoundMs) {
            await Promise.race([this.changed(state), sleep(this.settings.waitBoundMs - (Date.now() - started))]);
        }
        const waitedMs = Date.now() - started;
        const turns = turnsOf(base);
        const pendingTurns = this.pendingTurns(state, turns, regenerating);
        try {
            const { status, data } = await this.client.queryMemory(state.id, asked, window, this.config(), pendingTurns);
            this.lastQuery = { waitedMs, pendingTurns, heldBack: data?.held_back ?? [], status, window: window.length, chatTokens: tokens };
            if (status !== 200 || !data?.ok) {
                this.host.setPrompt('');
                this.setStatus('error', `memory query: ${data?.reason ?? `HTTP ${status}`}`);
                return null;
            }
            this.lastPacket = data.injection_packet;
            this.host.setPrompt(data.injection_packet.text ?? '');
            this.showProgress(state);
            return data.injection_packet;
        } catch (error) {
            this.lastQuery = { waitedMs, pendingTurns, heldBack: [], status: 0, window: window.length, chatTokens: tokens };
            this.host.setPrompt('');
            this.setStatus('error', `memory query: ${error.message}`);
            return null;
        }
    }

    /** The `chatLorebook` option: once memory holds the chat as it is, fetch the chat's lorebook
     *  and hand it to `host.offerLorebook(name, book, chatId)` (which saves it as World Info
     *  and binds it to the chat). In the background: nothing awaits it but the tests. A failure
     *  is kept in `lastLorebook` and tried again after the next write. */
    refreshLorebook(state) {
        if (!this.settings.chatLorebook || !this.host.offerLorebook || !state.lorebookStale
            || state.lorebookRunning || state.running || state.failure || state.deleted) return null;
        state.lorebookStale = false;
        const name = state.lorebookName ?? lorebookName(state.id);
        const done = (status, detail, entries = 0) => {
            this.lastLorebook = { at: Date.now(), chatId: state.id, name, status, entries, detail };
        };
        state.lorebookRunning = (async () => {
            try {
                const { status, data } = await this.client.lorebook(state.id);
                if (status === 404) return done('empty', 'memory holds nothing of this chat yet');
                if (status !== 200 || !data?.entries) {
                    throw new SidecarError(data?.reason ?? `reading the lorebook failed (HTTP ${status})`, status, data);
                }
                const detail = await this.host.offerLorebook(name, data, state.id);
                return done('offered', String(detail ?? ''), Object.keys(data.entries).length);
            } catch (error) {
                state.lorebookStale = true;
                return done('error', error.message);
            }
        })().finally(() => {
            state.lorebookRunning = null;
            // Memory changed again while this one was on its way: offer the newer book.
            if (state.lorebookStale && !state.failure && this.lastLorebook?.status !== 'error') this.refreshLorebook(state);
        });
        return state.lorebookRunning;
    }

    /** SillyTavern deleted chat `chatId` (CHAT_DELETED, GROUP_CHAT_DELETED): forget what memory
     *  holds of it (the `forgetDeletedChats` option). In the background: the handler returns
     *  at once. The chat's writer is stopped and awaited first, since a write landing after the
     *  forget would bring the chat back. A failure is retried with backoff while the page is
     *  open (the badge's click retries at once), and the chat is kept among the host's pending
     *  forgets until it lands, so a reload sends it again (`resumeForgets`). Returns the
     *  forget's promise (tests). */
    onChatDeleted(chatId) {
        if (!this.settings.enabled || !this.settings.forgetDeletedChats || chatId == null || chatId === '') return null;
        const state = this.chatState(chatId);
        if (state.forgetting) return state.forgetting;
        state.deleted = true;
        this.pendingForget(state.id, true);
        if (state.wake) state.wake(); // a writer waiting out a backoff stops now
        const step = { kind: 'forget', turnId: null };
        state.forgetting = (async () => {
            if (state.running) await state.running;
            // A book being saved lands before the forget, which then deletes it.
            if (state.lorebookRunning) await state.lorebookRunning;
            for (let attempt = 1; ; attempt++) {
                let status = 0;
                let data = null;
                try {
                    ({ status, data } = await this.client.forget(state.id));
                } catch (error) {
                    data = { reason: error.message };
                }
                if (status === 200 && data?.ok) {
                    const detail = data.found
                        ? `deleted chat forgotten: ${data.removed.memory} remembered turn(s)`
                        : 'deleted chat: memory held nothing of it';
                    const book = await this.deleteLorebook(state);
                    this.record(state, step, 'idle', book ? `${detail}; its lorebook "${book}" deleted` : detail);
                    return data;
                }
                const reason = data?.reason ?? `HTTP ${status}`;
                if (!retryable(status)) {
                    this.record(state, step, 'error', `forgetting the deleted chat was refused: ${reason}`);
                    return data;
                }
                const delay = this.retryDelay(attempt);
                this.setStatus('error', `forgetting a deleted chat: ${reason}; retrying in ${Math.round(delay / 1000)}s (click to retry now)`);
                await pause(state, delay);
            }
        })().finally(() => {
            this.pendingForget(state.id, false);
            if (this.chats.get(state.id) === state) this.chats.delete(state.id);
            this.setStatus(this.outcome.status, this.outcome.detail);
        });
        return state.forgetting;
    }

    /** The lorebook the extension saved for a deleted chat (`chatLorebook`), deleted with its
     *  memory: the book holds the chat's words too. Its name is the one this page knows, else
     *  the one the host recorded when it saved it (`host.lorebookOf(chatId)`: a renamed chat's
     *  book keeps its first name), else the chat's own (`lorebookName`); only a book the
     *  extension names, never one the user bound. The name when a book was deleted, else null
     *  (none was saved, or the host cannot delete one; a failure is logged, not retried). */
    async deleteLorebook(state) {
        if (!this.host.deleteLorebook) return null;
        const name = state.lorebookName ?? this.host.lorebookOf?.(state.id) ?? lorebookName(state.id);
        try {
            return (await this.host.deleteLorebook(name, state.id)) ? name : null;
        } catch (error) {
            console.warn(`[skald-memory] deleting the lorebook "${name}" of deleted chat ${state.id} failed: ${error.message}`);
            return null;
        }
    }

    /** Keeps (or drops) a deleted chat among the forgets still to land, in the host's storage
     *  (`host.loadPendingForgets()`, `host.savePendingForgets(ids)`: SillyTavern's settings). */
    pendingForget(chatId, pending) {
        if (!this.host.loadPendingForgets || !this.host.savePendingForgets) return;
        const ids = new Set((this.host.loadPendingForgets() ?? []).map(String));
        if (pending === ids.has(chatId)) return;
        if (pending) ids.add(chatId);
        else ids.delete(chatId);
        this.host.savePendingForgets([...ids]);
    }

    /** At start-up: forget again the deleted chats whose forget had not landed before the page
     *  was reloaded or closed. Returns their promises (tests). */
    resumeForgets() {
        return (this.host.loadPendingForgets?.() ?? []).map((id) => this.onChatDeleted(String(id))).filter(Boolean);
    }

    // SillyTavern's events: each only kicks the writer (SillyTavern awaits its handlers).
    onMessageReceived() {
        return this.kick();
    }

    onMessageSwiped() {
        return this.kick();
    }

    onMessageEdited() {
        return this.kick();
    }

    onMessageDeleted() {
        return this.kick();
    }

    onChatChanged() {
        return this.kick();
    }
}

/** Waits `ms`, or less when `state.wake()` is called (the badge's click: retry now). */
async function pause(state, ms) {
    await new Promise((resolve) => {
        const timer = setTimeout(resolve, ms);
        state.wake = () => {
            clearTimeout(timer);
            resolve();
        };
    });
    state.wake = null;
}

function sleep(ms) {
    return new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));
}
