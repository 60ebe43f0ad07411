// Skald memory for SillyTavern: the glue to SillyTavern's extension API (public/script.js and
// public/scripts/extensions.js of SillyTavern/SillyTavern). The behaviour is in sidecar-core.js.
//
// - memory before the reply: the manifest's `generate_interceptor` (skaldMemoryInterceptor) is
//   awaited by Generate() after the user's message is in the chat and before the prompt is
//   built, so the packet set with setExtensionPrompt lands in this very prompt
// - eventSource events: SillyTavern awaits every handler before it gives the user the send
//   button back, so each handler only kicks the chat's background writer and returns
//   undefined at once: MESSAGE_RECEIVED, MESSAGE_SWIPED, MESSAGE_EDITED, MESSAGE_UPDATED,
//   MESSAGE_DELETED, CHAT_CHANGED (a renamed chat is found on the next write and its memory
//   moved: the chat's metadata keeps the id memory was written under, `skald_memory`);
//   CHAT_DELETED and GROUP_CHAT_DELETED start forgetting that chat
//   (memory.onChatDeleted, in the background; one that has not landed is kept in the settings'
//   `pendingForgets` and sent again after a reload); APP_READY only sets
//   globalThis.skaldMemoryAppReady (start-up done)
// - settings: SillyTavern keeps `extension_settings` in its settings file
//   (data/<user>/settings.json, key `extension_settings.skald_memory`); the panel in the
//   Extensions drawer edits baseUrl, token, enabled, tokenBudget, recallK, chatLorebook,
//   forgetDeletedChats and importHistory, and saves with
//   saveSettingsDebounced
// - the chat's lorebook (chatLorebook, off by default): the book is saved the way SillyTavern's
//   own World Info editor saves one (world-info.js saveWorldInfo: its cache, then POST
//   /api/worldinfo/edit), created first like /getchatbook creates a chat book
//   (createNewWorldInfo, which lists it in the World Info panel), and bound to the chat the
//   way the "Chat Lore" button binds one (chat_metadata.world_info, then saveMetadata). A chat
//   already bound to another book keeps it. Which book is whose is kept in the settings
//   (`chatLorebooks`), and a deleted chat's book is deleted with its memory (deleteWorldInfo).
//   world-info.js is imported only when a book is offered or deleted, so a SillyTavern that
//   moved it breaks the option, never the memory.
import {
    DEFAULT_SETTINGS, PROMPT_KEY, PROMPT_POSITION_IN_PROMPT, RECALL_K_RANGE, STATUS_LABELS, SkaldMemory, TOKEN_BUDGET_RANGE, boundedSetting, turnsOf,
} from './sidecar-core.js';

// world-info.js's METADATA_KEY: where a chat's metadata names its lorebook.
const CHAT_LOREBOOK_KEY = 'world_info';
// Where a chat's metadata records the conversation id memory was written under, the name of
// its lorebook and the character or group it belongs to ({conversation_id, lorebook, owner}): it survives a rename (SillyTavern's
// /api/chats/rename moves the file, metadata and all).
const CHAT_MEMORY_KEY = 'skald_memory';

const MODULE = 'skald_memory';

function context() {
    return globalThis.SillyTavern.getContext();
}

// The extension's settings, one object kept in SillyTavern's settings (defaults filled in
// place, so every call gives the object a change is saved in).
function settings() {
    const all = context().extensionSettings;
    all[MODULE] ??= {};
    for (const [key, value] of Object.entries(DEFAULT_SETTINGS)) {
        if (!(key in all[MODULE])) all[MODULE][key] = value;
    }
    return all[MODULE];
}

// Every badge change, for whoever wants to see what memory did (the browser test reads it).
const badgeLog = [];
globalThis.skaldMemoryBadgeLog = badgeLog;

function badge() {
    let element = document.getElementById('skald_memory_badge');
    if (!element) {
        element = document.createElement('div');
        element.id = 'skald_memory_badge';
        element.className = 'skald-memory-badge';
        element.title = 'Skald memory';
        element.addEventListener('click', () => memory.retryNow());
        document.body.appendChild(element);
    }
    return element;
}

const host = {
    getChat: () => context().chat,
    getChatId: () => context().getCurrentChatId(),
    setPrompt: (text) => context().setExtensionPrompt(PROMPT_KEY, text, PROMPT_POSITION_IN_PROMPT, 0),
    // What the prompt holds beside the chat that the extension can read: the cards of the
    // chat's characters (a group's members: all of them, counting high) and the other
    // extensions' prompts (memory's own counts as its token budget).
    promptExtras: () => {
        const ctx = context();
        const members = ctx.groupId
            ? (ctx.groups.find((g) => g.id === ctx.groupId)?.members ?? []).map((avatar) => ctx.characters.find((c) => c.avatar === avatar))
            : [ctx.characters?.[ctx.characterId]];
        const cards = members.filter(Boolean).flatMap((c) => [c.description, c.personality, c.scenario, c.mes_example]);
        const others = Object.entries(ctx.extensionPrompts ?? {}).filter(([key]) => key !== PROMPT_KEY).map(([, p]) => p?.value);
        return [...cards, ...others].filter((text) => typeof text === 'string' && text).join('\n');
    },
    onStatus: (status, detail) => {
        const element = badge();
        const text = `memory: ${STATUS_LABELS[status] ?? status}`;
        const title = detail ? `Skald memory: ${detail}` : 'Skald memory';
        if (element.dataset.status === status && element.textContent === text && element.title === title) return;
        element.dataset.status = status;
        element.textContent = text;
        element.title = title;
        badgeLog.push({ at: Date.now(), status, detail });
    },
    // What the chat's metadata records of its memory: {conversation_id, lorebook} (null: never recorded).
    getChatMemory: () => context().chatMetadata?.[CHAT_MEMORY_KEY] ?? null,
    setChatMemory: async (record) => {
        const ctx = context();
        ctx.chatMetadata[CHAT_MEMORY_KEY] = record;
        await ctx.saveMetadata();
    },
    // The character or group the open chat belongs to (a chat's record names it, so a chat
    // imported from elsewhere is told from a renamed one).
    getChatOwner: () => {
        const ctx = context();
        if (ctx.groupId) return `group:${ctx.groupId}`;
        const avatar = ctx.characters[ctx.characterId]?.avatar;
        return avatar ? `character:${avatar}` : null;
    },
    // Whether SillyTavern still holds a chat of that id: the open group's chats, or the open
    // character's chat files (POST /api/characters/chats, as getPastCharacterChats asks).
    chatExists: async (id) => {
        const ctx = context();
        if (ctx.groupId) {
            const group = ctx.groups.find((g) => g.id === ctx.groupId);
            return Boolean(group?.chats?.includes(id));
        }
        const character = ctx.characters[ctx.characterId];
        if (!character) return true; // nothing to look in: taken as existing, so nothing moves
        const response = await fetch('/api/characters/chats', {
            method: 'POST',
            headers: ctx.getRequestHeaders(),
            body: JSON.stringify({ avatar_url: character.avatar, simple: true }),
        });
        if (!response.ok) throw new Error(`listing the chats failed (HTTP ${response.status})`);
        const files = await response.json();
        if (!Array.isArray(files)) return false; // {error: true}: the character has no chat files
        return files.some((file) => file.file_name === `${id}.jsonl`);
    },
    // The lorebook saved for a chat (offerLorebook records it), and its deletion with the chat's
    // memory (world-info.js deleteWorldInfo: false when there is no such book).
    lorebookOf: (chatId) => settings().chatLorebooks?.[chatId] ?? null,
    deleteLorebook: async (name, chatId) => {
        const worldInfo = await import('../../../world-info.js');
        const deleted = await worldInfo.deleteWorldInfo(name);
        const books = settings().chatLorebooks ?? {};
        if (chatId in books) {
            delete books[chatId];
            context().saveSettingsDebounced();
        }
        return deleted;
    },
    // Deleted chats whose forget has not landed yet: kept with the settings, resent after a reload.
    loadPendingForgets: () => settings().pendingForgets ?? [],
    savePendingForgets: (ids) => {
        settings().pendingForgets = ids;
        context().saveSettingsDebounced();
    },
    offerLorebook: async (name, book, chatId) => {
        // /scripts/extensions/third-party/skald-memory/ -> /scripts/world-info.js
        const worldInfo = await import('../../../world-info.js');
        if (!worldInfo.world_names?.includes(name)) await worldInfo.createNewWorldInfo(name, { interactive: false });
        await worldInfo.saveWorldInfo(name, book, true);
        // Which book is whose, for when the chat is deleted (its metadata goes with it).
        if (settings().chatLorebooks?.[chatId] !== name) {
            settings().chatLorebooks = { ...(settings().chatLorebooks ?? {}), [chatId]: name };
            context().saveSettingsDebounced();
        }
        const ctx = context();
        if (ctx.getCurrentChatId() !== chatId) return `saved as "${name}"; another chat is open, not bound`;
        const bound = ctx.chatMetadata[CHAT_LOREBOOK_KEY];
        if (bound && bound !== name) return `saved as "${name}"; the chat keeps its lorebook "${bound}"`;
        if (bound !== name) {
            ctx.chatMetadata[CHAT_LOREBOOK_KEY] = name;
            await ctx.saveMetadata();
            document.querySelectorAll('.chat_lorebook_button').forEach((button) => button.classList.add('world_set'));
        }
        return `saved as "${name}", the chat's lorebook`;
    },
};

const memory = new SkaldMemory(host, settings());
// For the console and the browser test: the extension's state, and the chat's turns as it sees them.
globalThis.skaldMemory = memory;
globalThis.skaldMemoryTurns = () => turnsOf(context().chat).map(({ turnId, text }) => ({ turnId, text }));
host.onStatus('idle', '');

function applySettings() {
    memory.settings = { ...memory.settings, ...settings() };
    memory.client.baseUrl = String(memory.settings.baseUrl).replace(/\/+$/, '');
    memory.client.token = memory.settings.token;
}

// Settings panel in SillyTavern's Extensions drawer: sidecar URL and token.
function settingsPanel() {
    const container = document.getElementById('extensions_settings');
    if (!container || document.getElementById('skald_memory_settings')) return;
    const panel = document.createElement('div');
    panel.id = 'skald_memory_settings';
    panel.innerHTML = `
        <h4>Skald memory</h4>
        <label>Sidecar URL <input id="skald_memory_url" class="text_pole" type="text"></label>
        <label>Token <input id="skald_memory_token" class="text_pole" type="password"></label>
        <label><input id="skald_memory_enabled" type="checkbox"> enabled</label>
        <label>Memory's share of the prompt (tokens) <input id="skald_memory_token_budget" class="text_pole" type="number" min="${TOKEN_BUDGET_RANGE[0]}" max="${TOKEN_BUDGET_RANGE[1]}" step="64"></label>
        <label>Earlier turns recalled <input id="skald_memory_recall_k" class="text_pole" type="number" min="${RECALL_K_RANGE[0]}" max="${RECALL_K_RANGE[1]}" step="1"></label>
        <label><input id="skald_memory_chat_lorebook" type="checkbox"> offer memory as the chat's lorebook</label>
        <label><input id="skald_memory_forget_deleted" type="checkbox"> forget a chat's memory when the chat is deleted</label>
        <label><input id="skald_memory_import_history" type="checkbox"> import a chat far behind memory at once (its older turns as text, without facts)</label>`;
    container.appendChild(panel);
    const current = settings();
    const url = panel.querySelector('#skald_memory_url');
    const token = panel.querySelector('#skald_memory_token');
    const enabled = panel.querySelector('#skald_memory_enabled');
    const tokenBudget = panel.querySelector('#skald_memory_token_budget');
    const recallK = panel.querySelector('#skald_memory_recall_k');
    const chatLorebook = panel.querySelector('#skald_memory_chat_lorebook');
    const forgetDeleted = panel.querySelector('#skald_memory_forget_deleted');
    const importHistory = panel.querySelector('#skald_memory_import_history');
    url.value = current.baseUrl;
    token.value = current.token;
    enabled.checked = current.enabled;
    tokenBudget.value = String(current.tokenBudget);
    recallK.value = String(current.recallK);
    chatLorebook.checked = current.chatLorebook;
    forgetDeleted.checked = current.forgetDeletedChats;
    importHistory.checked = current.importHistory;
    const save = () => {
        const kept = settings();
        Object.assign(kept, {
            baseUrl: url.value.trim(),
            token: token.value.trim(),
            enabled: enabled.checked,
            tokenBudget: boundedSetting(tokenBudget.value, TOKEN_BUDGET_RANGE, kept.tokenBudget),
            recallK: boundedSetting(recallK.value, RECALL_K_RANGE, kept.recallK),
            chatLorebook: chatLorebook.checked,
            forgetDeletedChats: forgetDeleted.checked,
            importHistory: importHistory.checked,
        });
        applySettings();
        context().saveSettingsDebounced();
        memory.retryNow();
    };
    for (const input of [url, token, enabled, tokenBudget, recallK, chatLorebook, forgetDeleted, importHistory]) {
        input.addEventListener('change', () => {
            save();
            // What was kept: a number outside the sidecar's bounds shows the bound it became.
            tokenBudget.value = String(settings().tokenBudget);
            recallK.value = String(settings().recallK);
        });
    }
}
settingsPanel();

// Called by SillyTavern (manifest.generate_interceptor; runGenerationInterceptors passes
// chat, contextSize, abort and skips dry runs and quiet generations) with the prompt's chat and
// its size in tokens (less the reply's), which tells how much of the chat the prompt holds.
globalThis.skaldMemoryInterceptor = async function skaldMemoryInterceptor(chat, contextSize) {
    applySettings();
    await memory.beforeGeneration(chat, contextSize);
};

const { eventSource, eventTypes } = context();
// SillyTavern's start-up ends with APP_READY: until then its loader, a modal dialog, makes the
// rest of the page inert (text typed into the chat box lands nowhere, a click on send waits for
// the loader and sends an empty box), and start-up may still restore the chat box's saved input.
// SillyTavern loads extensions during start-up (awaited, before APP_READY), so this listener is
// in time. For whoever drives the page (the browser test): type only once this is true.
globalThis.skaldMemoryAppReady = false;
if (eventTypes.APP_READY) {
    eventSource.on(eventTypes.APP_READY, () => {
        globalThis.skaldMemoryAppReady = true;
    });
}
const kick = () => {
    applySettings();
    memory.kick();
};
for (const event of [eventTypes.MESSAGE_RECEIVED, eventTypes.MESSAGE_SWIPED, eventTypes.MESSAGE_EDITED,
    eventTypes.MESSAGE_UPDATED, eventTypes.MESSAGE_DELETED, eventTypes.CHAT_CHANGED]) {
    if (event) eventSource.on(event, kick);
}
// A deleted chat (its name, as getCurrentChatId() gave it): forgotten in the background.
const forget = (chatId) => {
    applySettings();
    memory.onChatDeleted(chatId);
};
for (const event of [eventTypes.CHAT_DELETED, eventTypes.GROUP_CHAT_DELETED]) {
    if (event) eventSource.on(event, forget);
}
// Forgets a reload interrupted (the sidecar was down when the chat was deleted): sent again.
applySettings();
memory.resumeForgets();
