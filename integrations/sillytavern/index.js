// Skald memory for SillyTavern: the glue to SillyTavern's extension API (public/script.js and
// public/scripts/extensions.js of SillyTavern/SillyTavern). The behaviour is in sidecar-core.js.
//
// - memory before the reply: the manifest's `generate_interceptor` (skaldMemoryInterceptor) is
//   awaited by Generate() after the user's message is in the chat and before the prompt is
//   built, so the packet set with setExtensionPrompt lands in this very prompt
// - eventSource events: MESSAGE_RECEIVED (commit), MESSAGE_SWIPED and MESSAGE_EDITED (replace),
//   MESSAGE_DELETED (rewind), CHAT_CHANGED (badge back to idle)
import { DEFAULT_SETTINGS, PROMPT_KEY, PROMPT_POSITION_IN_PROMPT, SkaldMemory } from './sidecar-core.js';

const MODULE = 'skald_memory';

function context() {
    return globalThis.SillyTavern.getContext();
}

function settings() {
    const all = context().extensionSettings;
    all[MODULE] = { ...DEFAULT_SETTINGS, ...(all[MODULE] ?? {}) };
    return all[MODULE];
}

function badge() {
    let element = document.getElementById('skald_memory_badge');
    if (!element) {
        element = document.createElement('div');
        element.id = 'skald_memory_badge';
        element.className = 'skald-memory-badge';
        element.title = 'Skald memory';
        document.body.appendChild(element);
    }
    return element;
}

const host = {
    getChat: () => context().chat,
    getChatId: () => context().getCurrentChatId(),
    setPrompt: (text) => context().setExtensionPrompt(PROMPT_KEY, text, PROMPT_POSITION_IN_PROMPT, 0),
    onStatus: (status, detail) => {
        const element = badge();
        element.dataset.status = status;
        element.textContent = `memory: ${status}`;
        element.title = detail ? `Skald memory: ${detail}` : 'Skald memory';
    },
};

const memory = new SkaldMemory(host, settings());
host.onStatus('idle', '');

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
        <label><input id="skald_memory_enabled" type="checkbox"> enabled</label>`;
    container.appendChild(panel);
    const current = settings();
    const url = panel.querySelector('#skald_memory_url');
    const token = panel.querySelector('#skald_memory_token');
    const enabled = panel.querySelector('#skald_memory_enabled');
    url.value = current.baseUrl;
    token.value = current.token;
    enabled.checked = current.enabled;
    const save = () => {
        Object.assign(settings(), { baseUrl: url.value.trim(), token: token.value.trim(), enabled: enabled.checked });
        memory.settings = { ...memory.settings, ...settings() };
        memory.client.baseUrl = memory.settings.baseUrl.replace(/\/+$/, '');
        memory.client.token = memory.settings.token;
        context().saveSettingsDebounced();
    };
    for (const input of [url, token, enabled]) input.addEventListener('change', save);
}
settingsPanel();

// Called by SillyTavern (manifest.generate_interceptor; runGenerationInterceptors passes
// chat, contextSize, abort and skips dry runs and quiet generations) with the prompt's chat.
globalThis.skaldMemoryInterceptor = async function skaldMemoryInterceptor(chat) {
    memory.settings = { ...memory.settings, ...settings() };
    await memory.beforeGeneration(chat);
};

const { eventSource, eventTypes } = context();
eventSource.on(eventTypes.MESSAGE_RECEIVED, () => memory.onMessageReceived());
eventSource.on(eventTypes.MESSAGE_SWIPED, (index) => memory.onMessageSwiped(index));
eventSource.on(eventTypes.MESSAGE_EDITED, (index) => memory.onMessageEdited(index));
eventSource.on(eventTypes.MESSAGE_DELETED, (length) => memory.onMessageDeleted(length));
eventSource.on(eventTypes.CHAT_CHANGED, () => host.onStatus('idle', ''));
