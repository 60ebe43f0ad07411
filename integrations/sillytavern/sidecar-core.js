// Skald memory for SillyTavern: the logic, free of SillyTavern imports so plain node can test it.
//
// SillyTavern's chat is an array of messages {name, is_user, is_system, mes, send_date}.
// A turn is the run of messages that ends with a character's reply; its turn_id is the index
// of that reply in the chat, so the same reply keeps its id through swipes and edits. The
// sidecar (python -m flows.dialogue serve) is called through its HTTP API:
//   memory/query   before a generation: memory for the pending user message(s)
//   turn/replace   after a reply (also after a swipe or an edit): an unchanged turn is an
//                  idempotent replay, a changed one is rewound exactly and committed again
//   conversation/rewind   after messages are deleted

export const STATUSES = Object.freeze(['idle', 'syncing', 'committed', 'rollback', 'error']);
export const PROMPT_KEY = 'skald_memory';
// SillyTavern's extension_prompt_types (public/script.js): IN_PROMPT = 0, IN_CHAT = 1, BEFORE_PROMPT = 2.
export const PROMPT_POSITION_IN_PROMPT = 0;
export const WINDOW_MESSAGES = 12;

export const DEFAULT_SETTINGS = Object.freeze({
    enabled: true,
    baseUrl: 'http://127.0.0.1:8787',
    token: '',
    tokenBudget: 1024,
    recallK: 5,
    requireActions: true,
});

/** The sidecar's message form of one SillyTavern message, or null for system notes. */
export function toSidecarMessage(message, index) {
    if (!message || message.is_system) return null;
    const out = {
        role: message.is_user ? 'user' : 'assistant',
        content: String(message.mes ?? ''),
        message_id: String(index),
    };
    if (message.name) out.name = String(message.name).slice(0, 200);
    if (message.send_date) out.time = String(message.send_date).slice(0, 200);
    return out;
}

/** Turns of a chat: [{turnId, first, last, messages}], each ending with a character's reply.
 *  Trailing user messages without a reply are not a turn yet (they are pending). */
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
            turns.push({ turnId: index, first: start, last: index, messages });
            messages = [];
            start = index + 1;
        }
    });
    return turns;
}

/** The pending messages (after the last reply) and the window before them. */
export function pendingOf(chat) {
    const turns = turnsOf(chat);
    const from = turns.length ? turns[turns.length - 1].last + 1 : 0;
    const pending = [];
    for (let i = from; i < chat.length; i++) {
        const converted = toSidecarMessage(chat[i], i);
        if (converted && converted.content.trim() !== '') pending.push(converted);
    }
    const window = turns.flatMap((t) => t.messages).slice(-WINDOW_MESSAGES);
    return { pending, window };
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
        this.fetch = fetchImpl;
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

    async queryMemory(conversationId, pending, window, config) {
        return this.call('POST', '/memory/query', { conversation_id: conversationId, messages: pending, window, config });
    }

    async replaceTurn(conversationId, turnId, messages, window, config) {
        return this.call('POST', '/turn/replace', {
            conversation_id: conversationId, turn_id: turnId, messages, window, config,
        });
    }

    async rewind(conversationId, beforeTurn) {
        return this.call('POST', '/conversation/rewind', { conversation_id: conversationId, before_turn: beforeTurn });
    }
}

/**
 * The extension's behaviour over an abstract host: `host.getChat()`, `host.getChatId()`,
 * `host.setPrompt(text)`, `host.onStatus(status, detail)`. Every handler returns a promise
 * SillyTavern awaits (its eventSource.emit and generate interceptors await their handlers).
 */
export class SkaldMemory {
    constructor(host, settings = {}, client = null) {
        this.host = host;
        this.settings = { ...DEFAULT_SETTINGS, ...settings };
        this.client = client ?? new SidecarClient({ baseUrl: this.settings.baseUrl, token: this.settings.token });
        this.status = 'idle';
        this.detail = '';
        this.lastPacket = null;
        // What this chat's turns were committed as: turnId -> content key (to skip unchanged ones).
        this.committed = new Map();
        this.chatId = null;
        this.queue = Promise.resolve();
    }

    setStatus(status, detail = '') {
        if (!STATUSES.includes(status)) throw new Error(`unknown status ${status}`);
        this.status = status;
        this.detail = detail;
        this.host.onStatus?.(status, detail);
    }

    config() {
        return {
            token_budget: this.settings.tokenBudget,
            recall_k: this.settings.recallK,
            require_actions: this.settings.requireActions,
        };
    }

    /** Serialise the handlers: SillyTavern may fire events while a commit is in flight. */
    enqueue(work) {
        const run = this.queue.then(work, work);
        this.queue = run.catch(() => undefined);
        return run;
    }

    conversationId() {
        const id = this.host.getChatId();
        if (id !== this.chatId) {
            this.chatId = id;
            this.committed = new Map();
        }
        return id ? String(id) : null;
    }

    /** Before a generation: put memory for the pending message(s) into the prompt. */
    async beforeGeneration(chat = this.host.getChat()) {
        if (!this.settings.enabled) return null;
        return this.enqueue(async () => {
            const conversationId = this.conversationId();
            const { pending, window } = pendingOf(chat);
            if (!conversationId || pending.length === 0) {
                this.host.setPrompt('');
                return null;
            }
            this.setStatus('syncing', 'reading memory');
            try {
                const { status, data } = await this.client.queryMemory(conversationId, pending, window, this.config());
                if (status !== 200 || !data?.ok) {
                    this.host.setPrompt('');
                    this.setStatus('error', data?.reason ?? `memory query failed (HTTP ${status})`);
                    return null;
                }
                this.lastPacket = data.injection_packet;
                this.host.setPrompt(data.injection_packet.text ?? '');
                this.setStatus('idle', `${data.recalled.length} turns recalled`);
                return data.injection_packet;
            } catch (error) {
                this.host.setPrompt('');
                this.setStatus('error', error.message);
                return null;
            }
        });
    }

    /** Commit (or re-commit) every turn of the chat from `fromTurn` on whose text changed. */
    async sync({ fromIndex = 0 } = {}) {
        if (!this.settings.enabled) return [];
        return this.enqueue(async () => {
            const conversationId = this.conversationId();
            if (!conversationId) return [];
            const chat = this.host.getChat();
            const turns = turnsOf(chat);
            const results = [];
            let rewound = false;
            for (const turn of turns) {
                if (turn.last < fromIndex && !rewound) continue;
                const key = JSON.stringify(turn.messages);
                if (!rewound && this.committed.get(turn.turnId) === key) continue;
                this.setStatus('syncing', `turn ${turn.turnId}`);
                const window = turns.filter((t) => t.last < turn.first).flatMap((t) => t.messages).slice(-WINDOW_MESSAGES);
                let reply;
                try {
                    reply = await this.client.replaceTurn(conversationId, turn.turnId, turn.messages, window, this.config());
                } catch (error) {
                    this.setStatus('error', error.message);
                    return results;
                }
                const { status, data } = reply;
                results.push({ turnId: turn.turnId, status, data });
                if (status === 200 && data?.committed) {
                    this.committed.set(turn.turnId, key);
                    // A replaced turn rewinds every later one: they are committed again below.
                    if (!data.idempotent_hit) rewound = true;
                    this.setStatus('committed', `turn ${turn.turnId}`);
                } else if (status === 200 && data?.state === 'ROLLED_BACK') {
                    // Blocked by the commit gate: remembered as text, no facts. Not retried.
                    this.committed.set(turn.turnId, key);
                    rewound = true;
                    this.setStatus('rollback', data.reason ?? 'rolled back');
                } else {
                    this.setStatus(data?.retryable ? 'rollback' : 'error',
                        data?.reason ?? `commit failed (HTTP ${status})`);
                    return results;
                }
            }
            return results;
        });
    }

    /** A reply finished (MESSAGE_RECEIVED): commit it. */
    async onMessageReceived() {
        return this.sync();
    }

    /** A reply was swiped (MESSAGE_SWIPED): the shown alternative replaces the turn. A swipe
     *  that starts a new generation shows an empty message first: MESSAGE_RECEIVED follows. */
    async onMessageSwiped(messageIndex) {
        return this.sync({ fromIndex: Number(messageIndex) || 0 });
    }

    /** A message was edited (MESSAGE_EDITED): its turn and every later one are re-committed. */
    async onMessageEdited(messageIndex) {
        return this.sync({ fromIndex: Number(messageIndex) || 0 });
    }

    /** Messages were deleted (MESSAGE_DELETED with the new chat length): rewind to before the
     *  first turn that lost a message. */
    async onMessageDeleted(newLength) {
        if (!this.settings.enabled) return null;
        return this.enqueue(async () => {
            const conversationId = this.conversationId();
            if (!conversationId) return null;
            const gone = [...this.committed.keys()].filter((turnId) => turnId >= Number(newLength)).sort((a, b) => a - b);
            const kept = new Set(turnsOf(this.host.getChat()).map((t) => t.turnId));
            const changed = [...this.committed.keys()].filter((turnId) => turnId < Number(newLength) && !kept.has(turnId));
            const first = [...gone, ...changed].sort((a, b) => a - b)[0];
            if (first === undefined) return null;
            this.setStatus('syncing', `rewinding to before turn ${first}`);
            try {
                const { status, data } = await this.client.rewind(conversationId, first);
                if (status !== 200 || !data?.ok) {
                    this.setStatus('error', data?.reason ?? `rewind failed (HTTP ${status})`);
                    return data;
                }
                for (const turnId of [...this.committed.keys()]) {
                    if (turnId >= first) this.committed.delete(turnId);
                }
                this.setStatus('rollback', `rewound ${data.removed_turns.length} turns`);
                return data;
            } catch (error) {
                this.setStatus('error', error.message);
                return null;
            }
        });
    }
}
