// Drives real SillyTavern (already served) in headless Debian chromium through a chat with
// Seraphina, for tests/integrations/test_sillytavern_browser.py. Usage:
//   node drive.mjs <config.json>
// config: {url, chromium, profileDir, screenshots, out, scenario: "full" | "ordinary" | "history", sendBoundMs,
//          settleTimeoutMs, messages?: [...], lorebook?: {sidecarUrl, token, file, fact},
//          exchanges?, fact?, question? (the history scenario: an old chat the extension meets)}
// With `lorebook`, the full scenario ends by fetching the chat's lorebook from the sidecar,
// importing it through SillyTavern's own World Info import (the panel's file input), and
// reading the imported book's entries back from the World Info editor; then it ticks the
// extension's "offer memory as the chat's lorebook" option and waits for the book to be bound.
// It writes `out` (JSON): per generation the time the send button came back, the memory
// packet the extension set, the badge log, and the steps it took. Assertions on the prompts
// SillyTavern sent are the Python test's (it holds the chat backend's log).
import { createWriteStream, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { chromium } from 'playwright-core';

const config = JSON.parse(readFileSync(process.argv[2], 'utf-8'));
const out = { steps: [], generations: [], badges: [], errors: [], screenshots: [] };
const started = Date.now();
// The page's whole console, stamped, with the driver's steps, next to the screenshots: what
// SillyTavern did when a step failed.
const consoleLog = createWriteStream(join(config.screenshots, 'console.log'));
const log = (...parts) => {
    console.log(`[drive ${((Date.now() - started) / 1000).toFixed(1)}s]`, ...parts);
    consoleLog.write(`[${((Date.now() - started) / 1000).toFixed(2)}s] DRIVER: ${parts.join(' ')}\n`);
};

function save() {
    writeFileSync(config.out, JSON.stringify(out, null, 2));
}

const context = await chromium.launchPersistentContext(config.profileDir, {
    executablePath: config.chromium,
    headless: true,
    viewport: { width: 1280, height: 900 },
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
        '--disable-component-update', '--disable-sync'],
});
const page = context.pages()[0] ?? await context.newPage();
page.on('pageerror', (error) => out.errors.push(`pageerror: ${error.message}`));
page.on('console', (message) => {
    consoleLog.write(`[${((Date.now() - started) / 1000).toFixed(2)}s] ${message.type()}: ${message.text().slice(0, 2000)}\n`);
    if (message.type() === 'error') out.errors.push(`console: ${message.text()}`.slice(0, 500));
});

async function shot(name) {
    const path = join(config.screenshots, `${String(out.screenshots.length + 1).padStart(2, '0')}-${name}.png`);
    await page.screenshot({ path });
    out.screenshots.push(path);
    log('screenshot', path);
}

async function open() {
    await page.goto(config.url, { waitUntil: 'domcontentloaded' });
    await page.waitForFunction(() => globalThis.SillyTavern?.getContext && globalThis.skaldMemory
        && document.getElementById('skald_memory_badge'), null, { timeout: 120_000 });
    // SillyTavern's start-up done (its APP_READY, which the extension records). Before it, the
    // start-up loader, a modal dialog, makes the page inert: page.fill() into the chat box lands
    // nowhere and the click on send waits for the loader, then sends an empty box. The
    // characters, the chat and the connection below can all be there before it on a busy machine.
    await page.waitForFunction(() => globalThis.skaldMemoryAppReady === true, null, { timeout: 120_000 })
        .catch((error) => {
            throw new Error(`SillyTavern's start-up never finished (no APP_READY): ${error.message}`);
        });
    // The send button's comings and goings, stamped by the page's clock.
    await page.evaluate(() => {
        const button = document.getElementById('send_but');
        globalThis.skaldSendShown = [];
        new MutationObserver(() => {
            if (!button.classList.contains('displayNone')) globalThis.skaldSendShown.push(Date.now());
        }).observe(button, { attributes: true, attributeFilter: ['class'] });
    });
    await page.waitForFunction(() => SillyTavern.getContext().characters.some((c) => c.name === 'Seraphina'),
        null, { timeout: 60_000 });
    await page.evaluate(async () => {
        const ctx = SillyTavern.getContext();
        const id = ctx.characters.findIndex((c) => c.name === 'Seraphina');
        if (id < 0) throw new Error('no Seraphina among the characters');
        if (String(ctx.characterId) !== String(id)) await ctx.selectCharacterById(String(id));
    });
    await page.waitForFunction(() => document.querySelectorAll('#chat .mes').length >= 1
        && SillyTavern.getContext().getCurrentChatId(), null, { timeout: 60_000 });
    await page.evaluate(() => {
        if (SillyTavern.getContext().onlineStatus === 'no_connection') $('#api_button_openai').trigger('click');
    });
    await page.waitForFunction(() => SillyTavern.getContext().onlineStatus !== 'no_connection', null, { timeout: 60_000 });
    log('chat open:', await page.evaluate(() => SillyTavern.getContext().getCurrentChatId()));
}

async function chatLength() {
    return page.evaluate(() => SillyTavern.getContext().chat.length);
}

/** Waits until a generation finished: a reply at the end, the send button shown. */
async function generationDone(kind, text, before) {
    const t0 = Date.now();
    await page.waitForFunction(([n, swipe]) => {
        const ctx = SillyTavern.getContext();
        const last = ctx.chat[ctx.chat.length - 1];
        const grown = swipe ? true : ctx.chat.length >= n + 2;
        return grown && last && !last.is_user && last.mes && last.mes !== '...'
            && !document.getElementById('send_but').classList.contains('displayNone');
    }, [before, kind === 'swipe'], { timeout: 120_000, polling: 50 });
    const state = await page.evaluate(() => ({
        shown: globalThis.skaldSendShown.slice(),
        packet: globalThis.skaldMemory.lastPacket?.text ?? null,
        query: globalThis.skaldMemory.lastQuery,
        reply: SillyTavern.getContext().chat.at(-1).mes,
        length: SillyTavern.getContext().chat.length,
        status: globalThis.skaldMemory.status,
        pending: globalThis.skaldMemory.pending,
    }));
    const generation = { kind, text, startedAt: t0, ...state };
    out.generations.push(generation);
    log(`${kind} done: "${state.reply.slice(0, 60)}" badge=${state.status} pending=${state.pending}`
        + ` waited=${state.query?.waitedMs}ms pending_turns=${JSON.stringify(state.query?.pendingTurns?.map((p) => p.turn_id))}`);
    save();
    return generation;
}

/** Types into a text box and checks the text is there: text typed into an inert page (a modal
 *  open) lands nowhere, and the next click would act on an empty box. */
async function type(selector, text) {
    await page.fill(selector, text);
    const typed = await page.inputValue(selector);
    if (typed !== text) {
        throw new Error(`typed ${JSON.stringify(text.slice(0, 60))} into ${selector}, it holds ${JSON.stringify(typed.slice(0, 60))}`
            + ` (modal open: ${await page.evaluate(() => Boolean(document.querySelector('dialog:modal')))})`);
    }
}

async function send(text) {
    const before = await chatLength();
    out.steps.push({ at: Date.now(), step: 'send', text });
    await type('#send_textarea', text);
    log(`send: typed "${text.slice(0, 40)}" (chat length ${before})`);
    await page.click('#send_but');
    log('send: clicked');
    return generationDone('send', text, before);
}

async function swipe() {
    const before = await chatLength();
    out.steps.push({ at: Date.now(), step: 'swipe' });
    await page.evaluate(() => $('#chat .mes.last_mes .swipe_right').trigger('click'));
    // The swipe's generation: the last reply gets a new alternative.
    await page.waitForFunction(() => {
        const last = SillyTavern.getContext().chat.at(-1);
        return Array.isArray(last.swipes) && last.swipes.length >= 2 && last.swipe_id === last.swipes.length - 1;
    }, null, { timeout: 120_000 });
    return generationDone('swipe', null, before);
}

async function edit(mesid, text) {
    out.steps.push({ at: Date.now(), step: 'edit', mesid, text });
    await page.evaluate((id) => $(`#chat .mes[mesid="${id}"] .mes_edit`).trigger('click'), mesid);
    await page.waitForSelector('#curEditTextarea');
    await type('#curEditTextarea', text);
    await page.evaluate((id) => $(`#chat .mes[mesid="${id}"] .mes_edit_done`).trigger('click'), mesid);
    await page.waitForFunction(([id, t]) => SillyTavern.getContext().chat[id].mes === t, [mesid, text]);
    log('edited message', mesid);
}

async function cut(from, to) {
    out.steps.push({ at: Date.now(), step: 'delete', from, to });
    const before = await chatLength();
    await type('#send_textarea', `/cut ${from}-${to}`);
    await page.click('#send_but');
    await page.waitForFunction((n) => SillyTavern.getContext().chat.length < n, before, { timeout: 30_000 });
    log(`deleted messages ${from}-${to}`);
}

/** Deletes the open chat as a user can, with SillyTavern's /delchat typed in the chat box (it
 *  opens another chat, then emits CHAT_DELETED), and waits for the extension to say what
 *  forgetting the chat's memory did. */
async function deleteChat(chatId) {
    out.steps.push({ at: Date.now(), step: 'delete-chat', chatId });
    await type('#send_textarea', '/delchat');
    await page.click('#send_but');
    await page.waitForFunction((id) => globalThis.skaldMemory.outcomes.some((o) => o.chatId === id && o.step === 'forget'),
        chatId, { timeout: 120_000, polling: 250 });
    out.deletedChat = await page.evaluate((id) => ({
        chatId: id,
        openChat: SillyTavern.getContext().getCurrentChatId(),
        forget: globalThis.skaldMemory.outcomes.filter((o) => o.chatId === id && o.step === 'forget'),
    }), chatId);
    log('deleted the chat:', JSON.stringify(out.deletedChat));
}

/** Renames the open chat with SillyTavern's renameChat, what the chat manager's rename button
 *  calls (the server moves the chat file, metadata and all; the chat reloads under its new
 *  name), and waits for the extension to say what moving the chat's memory did. */
async function renameChat() {
    const from = await page.evaluate(() => SillyTavern.getContext().getCurrentChatId());
    out.steps.push({ at: Date.now(), step: 'rename-chat', from });
    await page.evaluate((id) => SillyTavern.getContext().renameChat(id, `${id} renamed`), from);
    await page.waitForFunction((id) => ![id, undefined].includes(SillyTavern.getContext().getCurrentChatId()),
        from, { timeout: 60_000, polling: 250 });
    const to = await page.evaluate(() => SillyTavern.getContext().getCurrentChatId());
    await page.waitForFunction((id) => globalThis.skaldMemory.outcomes.some((o) => o.chatId === id && o.step === 'rename'),
        to, { timeout: 120_000, polling: 250 });
    await settled('after the rename');
    if (out.chatLorebook) {
        // The book the chat is bound to, offered again for the chat under its new name.
        await page.waitForFunction((id) => globalThis.skaldMemory.lastLorebook?.chatId === id,
            to, { timeout: 120_000, polling: 250 });
    }
    out.renamedChat = await page.evaluate(([a, b]) => ({
        from: a,
        to: b,
        outcomes: globalThis.skaldMemory.outcomes.filter((o) => o.chatId === b),
        lorebook: { ...globalThis.skaldMemory.lastLorebook, bound: SillyTavern.getContext().chatMetadata.world_info ?? null },
    }), [from, to]);
    log('renamed the chat:', JSON.stringify(out.renamedChat));
}

/** What memory holds of the open chat, and the chat's turns as the extension sees them. */
async function memoryOfOpenChat() {
    return page.evaluate(async () => {
        const chatId = SillyTavern.getContext().getCurrentChatId();
        const { data } = await globalThis.skaldMemory.client.turns(chatId);
        return {
            chatId,
            chatTurns: globalThis.skaldMemoryTurns(),
            memoryTurns: data.items.map((t) => ({ turnId: Number(t.turn_id), text: t.text })),
        };
    });
}

/** Branches the open chat at its second turn's reply with SillyTavern's /branch-create typed in
 *  the chat box (it opens the branch), and waits for the extension to copy the memory. */
async function branchChat() {
    const from = await page.evaluate(() => SillyTavern.getContext().getCurrentChatId());
    const at = await page.evaluate(() => globalThis.skaldMemoryTurns()[1].turnId);
    out.steps.push({ at: Date.now(), step: 'branch-chat', from, mesId: at });
    await type('#send_textarea', `/branch-create ${at}`);
    await page.click('#send_but');
    await page.waitForFunction((id) => ![id, undefined].includes(SillyTavern.getContext().getCurrentChatId()),
        from, { timeout: 60_000, polling: 250 });
    const to = await page.evaluate(() => SillyTavern.getContext().getCurrentChatId());
    await page.waitForFunction((id) => globalThis.skaldMemory.outcomes.some((o) => o.chatId === id && o.step === 'copy'),
        to, { timeout: 120_000, polling: 250 });
    await settled('after the branch');
    out.branchedChat = {
        from,
        mesId: at,
        ...(await memoryOfOpenChat()),
        outcomes: await page.evaluate((id) => globalThis.skaldMemory.outcomes.filter((o) => o.chatId === id), to),
    };
    log('branched the chat:', JSON.stringify(out.branchedChat.outcomes));
}

/** Waits until the extension's writer has nothing left to write for this chat. */
async function settled(label) {
    const t0 = Date.now();
    await page.waitForFunction(() => {
        const memory = globalThis.skaldMemory;
        const state = memory.currentChat();
        return state && state.loaded && !state.running && memory.pendingWrites(state) === 0;
    }, null, { timeout: config.settleTimeoutMs ?? 600_000, polling: 250 });
    log(`memory settled (${label}) after ${Date.now() - t0}ms:`, await page.evaluate(() => globalThis.skaldMemory.status));
    out.steps.push({ at: Date.now(), step: 'settled', label, waitedMs: Date.now() - t0 });
}

/** Waits until SillyTavern's server holds the chat as the page has it. A delete is saved by a
 *  debounced save (1 s later): a reload before it lands brings the deleted messages back. */
async function saved(label) {
    const t0 = Date.now();
    await page.evaluate(() => SillyTavern.getContext().saveChat());
    await page.waitForFunction(async () => {
        const ctx = SillyTavern.getContext();
        const character = ctx.characters[ctx.characterId];
        const response = await fetch('/api/chats/get', {
            method: 'POST', headers: ctx.getRequestHeaders(),
            body: JSON.stringify({ ch_name: character.name, file_name: character.chat, avatar_url: character.avatar }),
        });
        const lines = await response.json(); // the chat's metadata line, then its messages
        return response.ok && lines.length - 1 === ctx.chat.length
            && lines.slice(1).every((m, i) => m.mes === ctx.chat[i].mes);
    }, null, { timeout: 60_000, polling: 250 });
    log(`chat saved (${label}) after ${Date.now() - t0}ms`);
}

/** The chat's lorebook: fetched from the sidecar, imported through SillyTavern's World Info
 *  panel (its import button's file input, so importWorldInfo and /api/worldinfo/import run as
 *  for a user), then read back from the editor's entries; the entry holding `fact` is opened. */
async function importLorebook({ sidecarUrl, token, file, fact }) {
    const chatId = await page.evaluate(() => SillyTavern.getContext().getCurrentChatId());
    const response = await fetch(`${sidecarUrl}/api/kg-sidecar/conversation/${encodeURIComponent(chatId)}/lorebook`,
        { headers: { Authorization: `Bearer ${token}` } });
    if (response.status !== 200) throw new Error(`lorebook: HTTP ${response.status}: ${await response.text()}`);
    const text = await response.text();
    writeFileSync(file, text);
    out.lorebook = JSON.parse(text);
    const bookName = file.split('/').at(-1).replace(/\.json$/, '');
    log(`lorebook: ${Object.keys(out.lorebook.entries).length} entries fetched for ${chatId}`);

    await page.click('#WIDrawerIcon');
    await page.waitForSelector('#WorldInfo.openDrawer', { timeout: 30_000 });
    await page.setInputFiles('#world_import_file', file);
    // Imported, listed, selected in the editor, and its entries drawn.
    await page.waitForFunction(([name, count]) => {
        const selected = document.querySelector('#world_editor_select option:checked');
        return selected && selected.textContent.trim() === name
            && document.querySelectorAll('#world_popup_entries_list .world_entry').length === count;
    }, [bookName, Object.keys(out.lorebook.entries).length], { timeout: 60_000, polling: 250 });
    out.lorebookShown = await page.evaluate(() => [...document.querySelectorAll('#world_popup_entries_list .world_entry')]
        .map((entry) => ({
            uid: entry.getAttribute('uid'),
            comment: entry.querySelector('textarea[name="comment"]')?.value ?? '',
            // The keywords: a select2 box, or a plain text box (SillyTavern's "plaintext" key input).
            keys: [...entry.querySelectorAll('select[name="key"] option:checked')].map((o) => o.value).concat(
                (entry.querySelector('textarea[name="key"]')?.value ?? '').split(',').map((k) => k.trim()).filter(Boolean)),
            content: entry.querySelector('textarea[name="content"]')?.value ?? '',
        })));
    log('lorebook shown:', JSON.stringify(out.lorebookShown.map((e) => [e.uid, e.comment, e.keys])));
    // Open the entry that holds the fact, so the screenshot shows its content.
    const opened = await page.evaluate((wanted) => {
        const entry = [...document.querySelectorAll('#world_popup_entries_list .world_entry')]
            .find((e) => e.querySelector('textarea[name="content"]')?.value.includes(wanted));
        if (!entry) return false;
        entry.querySelector('.inline-drawer-toggle').click();
        entry.scrollIntoView({ block: 'start' });
        return entry.getAttribute('uid');
    }, fact);
    if (!opened) throw new Error(`no entry of the imported lorebook holds "${fact}"`);
    await page.waitForFunction(([uid, wanted]) => {
        const area = document.querySelector(`#world_popup_entries_list .world_entry[uid="${uid}"] textarea[name="content"]`);
        return area && area.offsetParent !== null && area.value.includes(wanted);
    }, [opened, fact], { timeout: 30_000 });
    out.lorebookOpened = opened;
    await shot('lorebook-imported');
    out.lorebookScreenshot = out.screenshots.at(-1);
}

/** The extension's chatLorebook option, ticked in its settings panel at the end: the chat's
 *  memory is saved as World Info and bound as the chat's lorebook, in the background. */
async function offerChatLorebook() {
    await page.evaluate(() => {
        const box = document.getElementById('skald_memory_chat_lorebook');
        box.checked = true;
        box.dispatchEvent(new Event('change'));
    });
    await page.waitForFunction(() => ['offered', 'error'].includes(globalThis.skaldMemory.lastLorebook?.status),
        null, { timeout: 120_000, polling: 250 });
    out.chatLorebook = await page.evaluate(() => ({
        ...globalThis.skaldMemory.lastLorebook, bound: SillyTavern.getContext().chatMetadata.world_info ?? null,
    }));
    log('chat lorebook:', JSON.stringify(out.chatLorebook));
}

/** The panel's two numbers, typed out of the sidecar's bounds: what the settings keep, and
 *  what the inputs show after; then the defaults again. */
async function numberSettings() {
    out.numberSettings = await page.evaluate(() => {
        const type = (id, value) => {
            const input = document.getElementById(id);
            input.value = value;
            input.dispatchEvent(new Event('change'));
            return input;
        };
        const recall = type('skald_memory_recall_k', '99');
        const budget = type('skald_memory_token_budget', '10');
        const kept = SillyTavern.getContext().extensionSettings.skald_memory;
        const result = { recallK: kept.recallK, tokenBudget: kept.tokenBudget, shown: [recall.value, budget.value] };
        type('skald_memory_recall_k', '5');
        type('skald_memory_token_budget', '1024');
        return result;
    });
    log('number settings:', JSON.stringify(out.numberSettings));
}

async function badges() {
    return page.evaluate(() => globalThis.skaldMemoryBadgeLog.slice());
}

try {
    await open();
    await shot('chat-opened');
    if (config.scenario === 'full') {
        await send('My sister Ilse moved to Bergen to study marine biology last spring.');
        await send('I baked sourdough bread this morning, it came out a bit flat.');
        await send('The weather has been rainy all week, so I stayed in and read a novel about lighthouses.');
        await settled('before the question');
        await send('Where did my sister Ilse move to?');
        await shot('question-answered');
        await swipe();
        await shot('swiped');
        const rainy = await page.evaluate(() => SillyTavern.getContext().chat
            .findIndex((m) => m.is_user && m.mes.includes('rainy all week')));
        await edit(rainy, 'The weather has been sunny all week, so I went hiking up to the old lighthouse.');
        // Asked at once: the replace is still being written (the sidecar is slow).
        await send('What did I do this week when the weather was sunny?');
        await shot('asked-during-edit');
        await settled('after the edit');
        await send('Remind me: how was the weather this week, and what did I do?');
        await shot('asked-after-edit');
        const length = await chatLength();
        await cut(length - 2, length - 1);
        await settled('after the delete');
        await shot('deleted');
        out.badges.push(...(await badges()).map((b) => ({ ...b, before: 'reload' })));
        await saved('after the delete');
        await page.reload({ waitUntil: 'domcontentloaded' });
        await open();
        if (await chatLength() !== length - 2) throw new Error(`after the reload the chat has ${await chatLength()} messages, not ${length - 2}`);
        await settled('after the reload');
        await send('Thanks, Seraphina. Where does Ilse live now?');
        await settled('the end');
        await shot('after-reload');
        await numberSettings();
        if (config.lorebook) {
            await importLorebook(config.lorebook);
            await offerChatLorebook();
        }
        await renameChat();
        // What memory holds of the chat; then a branch of it, deleted: memory must copy the
        // branch's share of the chat, then forget the branch and keep the chat.
        Object.assign(out, await memoryOfOpenChat());
        await branchChat();
        if (config.lorebook) {
            // The branch's own book, saved once its memory is copied: deleted with the branch.
            await page.waitForFunction((id) => globalThis.skaldMemory.lastLorebook?.chatId === id
                && globalThis.skaldMemory.lastLorebook.status === 'offered', out.branchedChat.chatId, { timeout: 120_000, polling: 250 });
            out.branchedChat.lorebook = await page.evaluate(() => globalThis.skaldMemory.lastLorebook);
        }
        await deleteChat(out.branchedChat.chatId);
    } else if (config.scenario === 'history') {
        // An old chat the extension meets: `config.exchanges` exchanges saved into the open
        // chat behind the extension's back (no event), then the page reloaded, which opens it.
        await settled('the greeting');
        await page.evaluate(async ({ exchanges, fact }) => {
            const ctx = SillyTavern.getContext();
            for (let i = 0; i < exchanges; i++) {
                const mes = i === 0 ? fact : `Day ${i}: a quiet day at the library, sorting old maps.`;
                ctx.chat.push({ name: ctx.name1, is_user: true, send_date: `May ${1 + (i % 28)}, 2024 1:00pm`, mes });
                ctx.chat.push({ name: ctx.name2, is_user: false, send_date: `May ${1 + (i % 28)}, 2024 1:01pm`, mes: `Noted, day ${i}.` });
            }
        }, { exchanges: config.exchanges, fact: config.fact });
        await saved('the old chat');
        await page.reload({ waitUntil: 'domcontentloaded' });
        await open();
        await page.waitForFunction(() => globalThis.skaldMemoryBadgeLog.some((b) => b.detail.includes('importing')),
            null, { timeout: 120_000, polling: 50 });
        await shot('importing');
        await settled('the old chat');
        Object.assign(out, await memoryOfOpenChat());
        await send(config.question);
        await shot('history-asked');
    } else {
        for (const text of config.messages) await send(text);
        await settled('the end');
        await shot('ordinary-chat');
    }
    out.badges.push(...await badges());
    if (!out.chatId) {
        Object.assign(out, await page.evaluate(() => ({
            chatId: SillyTavern.getContext().getCurrentChatId(), chatTurns: globalThis.skaldMemoryTurns(),
        })));
    }
    out.outcomes = await page.evaluate(() => globalThis.skaldMemory.outcomes);
    out.ok = true;
} catch (error) {
    out.ok = false;
    out.errors.push(`driver: ${error.stack ?? error}`);
    try {
        out.badges.push(...await badges());
        await shot('failure');
    } catch {
        // the page is gone
    }
} finally {
    save();
    await context.close();
    await new Promise((resolve) => consoleLog.end(resolve));
}
process.exit(out.ok ? 0 : 1);
