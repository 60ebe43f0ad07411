// `node --test integrations/sillytavern/`: the extension's logic against the real sidecar,
// served on loopback by serve_for_tests.py (scripted model, real graph, real HTTP server).
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import {
    RECALL_K_RANGE, SidecarClient, SkaldMemory, TOKEN_BUDGET_RANGE, WINDOW_MESSAGES, boundedSetting, chatTokens, divergence, estimateTokens,
    IMPORT_HINT_TURNS, IMPORT_KEEP_TURNS, MAX_PENDING_TURN_BYTES, clipContent, jsonBytes, lorebookName, messageBytes, pendingOf, promptWindow, toSidecarMessage, turnsOf,
} from './sidecar-core.js';

const here = dirname(fileURLToPath(import.meta.url));
const repoRoot = join(here, '..', '..');

function python() {
    if (process.env.SKALD_PYTHON) return process.env.SKALD_PYTHON;
    const venv = join(repoRoot, '.venv', 'bin', 'python');
    return existsSync(venv) ? venv : 'python3';
}

let server;
let sidecar;

before(async () => {
    server = spawn(python(), [join(here, 'serve_for_tests.py')], {
        cwd: repoRoot, stdio: ['pipe', 'pipe', 'inherit'], env: { ...process.env, PYTHONUNBUFFERED: '1' },
    });
    const lines = createInterface({ input: server.stdout });
    sidecar = await new Promise((resolve, reject) => {
        server.once('exit', (code) => reject(new Error(`serve_for_tests.py exited with ${code}`)));
        lines.once('line', (line) => resolve(JSON.parse(line)));
    });
}, { timeout: 300_000 });

after(async () => {
    if (!server || server.exitCode !== null) return;
    // The helper shuts down when its stdin closes; wait for it, so no process outlives the test.
    const exited = new Promise((resolve) => server.once('exit', resolve));
    server.stdin.end();
    const timer = setTimeout(() => server.kill('SIGKILL'), 60_000);
    await exited;
    clearTimeout(timer);
});

/** A SillyTavern-like host: a chat array, a chat id, the prompt and badge it was given. */
function fakeHost(chatId) {
    return {
        chat: [],
        prompt: null,
        statuses: [],
        getChat() { return this.chat; },
        getChatId() { return chatId; },
        setPrompt(text) { this.prompt = text; },
        onStatus(status) { this.statuses.push(status); },
    };
}

const user = (mes) => ({ name: 'User', is_user: true, mes, send_date: '1:00 pm on 8 May, 2023' });
const bot = (mes) => ({ name: 'Seraphina', is_user: false, mes, send_date: '1:01 pm on 8 May, 2023' });

function memoryFor(host, extra = {}) {
    return new SkaldMemory(host, { baseUrl: sidecar.url, token: sidecar.token, ...extra });
}

/** Counts the client's write calls (the real client, calling the real sidecar). */
function countCalls(client) {
    const counts = { replaceTurn: 0, rewind: 0, importTurns: 0 };
    for (const name of Object.keys(counts)) {
        const real = client[name].bind(client);
        client[name] = (...args) => {
            counts[name] += 1;
            return real(...args);
        };
    }
    return counts;
}

async function listTurns(conversationId) {
    const client = new SidecarClient({ baseUrl: sidecar.url, token: sidecar.token });
    const { status, data } = await client.call('GET', `/conversations/${encodeURIComponent(conversationId)}/turns?limit=100`);
    assert.equal(status, 200);
    return data.items;
}

describe('chat segmentation', () => {
    test('turns end with a reply; trailing user messages are pending; system notes skipped', () => {
        const chat = [user('hi'), bot('hello'), { is_system: true, mes: 'note' }, user('a'), user('b'), bot('c'), user('next')];
        assert.deepEqual(turnsOf(chat).map((t) => [t.turnId, t.messages.length]), [[1, 2], [5, 3]]);
        assert.equal(turnsOf(chat)[0].text, 'User: hi\nSeraphina: hello');
        const { pending, window } = pendingOf(chat);
        assert.deepEqual(pending.map((m) => m.content), ['next']);
        assert.equal(window.length, 5);
        assert.deepEqual(pendingOf([user('only')]).pending.map((m) => m.content), ['only']);
        // The newest of what the query's body takes: 200 messages, and not three pasted texts.
        const flood = Array.from({ length: 250 }, (_, i) => user(`unanswered ${i}`));
        const kept = pendingOf(flood).pending;
        assert.equal(kept.length, 200);
        assert.equal(kept[199].content, 'unanswered 249');
        const pastes = Array.from({ length: 3 }, (_, i) => user(`${i}${'東'.repeat(60_000)}`));
        assert.deepEqual(pendingOf(pastes).pending.map((m) => m.content[0]), ['2']);
    });

    test('the window is what fits of the chat in the prompt; without the prompt\'s size, the last 12 messages', () => {
        const messages = Array.from({ length: 300 }, (_, i) => ({ role: 'user', name: 'User', content: `message ${i} here` }));
        const pending = [{ role: 'user', name: 'User', content: 'next' }];
        assert.equal(promptWindow(messages, pending, null).length, WINDOW_MESSAGES);
        // "User: message 123 here" is 22 characters: 8 tokens counted, and 4 for the separators.
        assert.equal(estimateTokens('User: message 123 here'), 8);
        const pendingCost = estimateTokens('User: next') + 4;
        assert.deepEqual(promptWindow(messages, pending, pendingCost + 12 * 10).map((m) => m.content),
            messages.slice(-10).map((m) => m.content));
        assert.deepEqual(promptWindow(messages, pending, pendingCost + 12 * 10 - 1).length, 9);
        assert.equal(promptWindow(messages, pending, 0).length, 0);  // no room: nothing shown
        assert.equal(promptWindow(messages, pending, 1e9).length, 200);  // the sidecar's limit
        const long = Array.from({ length: 50 }, () => ({ role: 'user', name: 'U', content: 'x'.repeat(4096) }));
        assert.equal(promptWindow(long, [], 1e9).length, 23);  // 96 KB of text at most (JSON's quotes in)
        // ... also when the prompt's size is not known: two 64K-character messages are too much.
        const pasted = Array.from({ length: 12 }, () => ({ role: 'user', name: 'U', content: 'x'.repeat(65_536) }));
        assert.equal(promptWindow(pasted, [], null).length, 1);
        // ... counted as bytes: three bytes a character of Japanese, six for an escaped control.
        assert.equal(jsonBytes('東京'), 8);
        assert.equal(jsonBytes('a\u0001'), 9);
        const japanese = Array.from({ length: 12 }, () => ({ role: 'user', name: 'U', content: '東'.repeat(20_000) }));
        assert.equal(promptWindow(japanese, [], null).length, 1);
        // ... and beside the pending messages: what they take of the body is not the window's
        // (280 KB for both: 192 KB pending leave 88 KB, 251 KB leave 29 KB).
        const bulky = [{ role: 'user', name: 'U', content: '東'.repeat(65_536) }];  // 192 KB
        const small = Array.from({ length: 12 }, () => ({ role: 'user', name: 'U', content: 'x'.repeat(29_000) }));
        assert.equal(promptWindow(small, [], null).length, 3);
        assert.equal(promptWindow(small, bulky, null).length, 3);
        const bulkier = [bulky[0], { role: 'user', name: 'U', content: 'x'.repeat(60_000) }];
        assert.equal(promptWindow(small, bulkier, null).length, 1);
        const bulkiest = [bulky[0], { role: 'user', name: 'U', content: 'x'.repeat(62_000) }];
        assert.equal(promptWindow(small, bulkiest, null).length, 0);
        // A message counts whole: its name and time too (a 200-character name on 200 messages
        // is 40 KB of the body).
        assert.equal(messageBytes({ role: 'user', name: 'U', content: 'hi' }), 42);
        const named = Array.from({ length: 200 }, () => ({ role: 'user', name: 'N'.repeat(200), content: 'x'.repeat(300) }));
        assert.equal(promptWindow(named, [], 1e9).length, 182);
        // Any other script counts a token a character (no tokenizer counts it lower).
        assert.equal(estimateTokens('東京に行った'), 6);
        // The room: the size, less a quarter and 300 kept, the card and memory's own budget.
        assert.equal(chatTokens(8192, '', 1024), 8192 - 2048 - 300 - 1024);
        assert.equal(chatTokens(8192, 'x'.repeat(3000), 1024), 8192 - 2048 - 300 - 1000 - 1024);
        assert.equal(chatTokens(1000, 'x'.repeat(3000), 1024), 0);
        assert.equal(chatTokens(undefined, '', 1024), null);
        assert.equal(chatTokens(8192, null, 1024), null);  // what else the prompt holds: unknown
    });

    test('a message longer than the sidecar takes is sent as its first 64K characters, no half character', () => {
        assert.equal(toSidecarMessage(user('x'.repeat(70_000)), 0).content.length, 65_536);
        assert.equal(clipContent('short'), 'short');
        const straddling = `${'x'.repeat(65_535)}\u{1F600}`;  // the emoji's units are the 65,536th and 65,537th
        assert.equal(clipContent(straddling), 'x'.repeat(65_535));
        assert.equal(clipContent(`${'x'.repeat(65_534)}\u{1F600}z`), `${'x'.repeat(65_534)}\u{1F600}`);
        // Half a character anywhere (the sidecar refuses JSON's "\ud800" as no text) is U+FFFD;
        // whole pairs stay.
        assert.equal(clipContent('a\uD800b\uDC00c\u{1F600}'), 'a\uFFFDb\uFFFDc\u{1F600}');
        assert.equal(toSidecarMessage(bot('half \uD83D'), 3).content, 'half \uFFFD');
    });

    test('a number typed into the settings keeps inside the sidecar\'s bounds; no number keeps the old', () => {
        assert.equal(boundedSetting('2000', TOKEN_BUDGET_RANGE, 1024), 2000);
        assert.equal(boundedSetting(' 10 ', TOKEN_BUDGET_RANGE, 1024), 64);
        assert.equal(boundedSetting('99999', TOKEN_BUDGET_RANGE, 1024), 32768);
        assert.equal(boundedSetting('7.6', RECALL_K_RANGE, 5), 8);
        assert.equal(boundedSetting('0', RECALL_K_RANGE, 5), 0);
        assert.equal(boundedSetting('abc', RECALL_K_RANGE, 5), 5);
        assert.equal(boundedSetting('', RECALL_K_RANGE, 5), 5);
    });

    test('divergence: the first turn memory holds differently, then the turns it lacks', () => {
        const turns = turnsOf([user('a'), bot('b'), user('c'), bot('d'), user('e'), bot('f')]);
        const synced = new Map([['1', 'User: a\nSeraphina: b'], ['3', 'User: c\nSeraphina: d']]);
        assert.deepEqual(divergence(turns, synced).rewrite, null);
        assert.deepEqual(divergence(turns, synced).fresh.map((t) => t.turnId), [5]);
        synced.set('3', 'User: c\nSeraphina: an older swipe');
        assert.equal(divergence(turns, synced).rewrite.kind, 'replace');
        synced.set('7', 'User: g\nSeraphina: h');  // memory holds a turn the chat lost
        synced.set('3', turns[1].text);
        assert.deepEqual(divergence(turns, synced).rewrite, { kind: 'rewind', turnId: '7' });
        // A turn the sidecar refused is not sent again unchanged.
        assert.deepEqual(divergence(turns, new Map(), new Map([['1', turns[0].text]])).fresh.map((t) => t.turnId), [3, 5]);
    });
});

describe('against the real sidecar', () => {
    test('no token: 401; the token: 200', async () => {
        const anonymous = new SidecarClient({ baseUrl: sidecar.url });
        assert.equal((await anonymous.health()).status, 401);
        const authorised = new SidecarClient({ baseUrl: sidecar.url, token: sidecar.token });
        assert.equal((await authorised.health()).status, 200);
    });

    test('handlers return at once; memory before generation holds what an earlier turn wrote', async () => {
        const host = fakeHost(`st-${Date.now()}-memory`);
        const memory = memoryFor(host);
        host.chat.push(user('My sister Elena moved to Lisbon to study marine biology!'), bot('How exciting, Lisbon!'));
        const running = memory.onMessageReceived();
        // The handler did not wait for the write: it is in flight, and the badge says so.
        assert.ok(running instanceof Promise);
        assert.equal(memory.status, 'syncing');
        assert.equal(memory.pending, 1);
        assert.equal(memory.detail, '1 pending');  // no bulk import named for a turn or two
        await memory.settled();
        assert.ok(['committed', 'nothing_new'].includes(memory.status), memory.detail);
        assert.deepEqual((await listTurns(host.getChatId())).map((t) => t.turn_id), ['1']);

        host.chat.push(user('Where did Elena move again?'));
        const packet = await memory.beforeGeneration(host.chat);
        assert.ok(packet, `memory query failed: ${memory.detail}`);
        assert.match(host.prompt, /Lisbon/);
        assert.deepEqual(packet.recalled_turns, ['1']);
        assert.deepEqual(memory.lastQuery.pendingTurns, []);
        assert.ok(host.statuses.includes('syncing'));
    });

    test('a pasted text longer than the sidecar takes is kept to its first 64K characters, and memory still answers', async () => {
        const host = fakeHost(`st-${Date.now()}-long`);
        const memory = memoryFor(host);
        // 70,000 characters, a surrogate pair straddling the 65,536th: no half of it is sent.
        const pasted = `My sister Elena moved to Lisbon. ${'x'.repeat(65_536 - 34)}\u{1F600}${'y'.repeat(4_000)}`;
        host.chat.push(user(pasted), bot('That is a long letter about Lisbon!'));
        memory.onMessageReceived();
        await memory.settled();
        assert.ok(['committed', 'nothing_new'].includes(memory.status), memory.detail);
        const [turn] = await listTurns(host.getChatId());
        assert.equal(turn.turn_id, '1');
        // Memory holds the text's first 65,535 characters: the emoji's first half was left out.
        const held = turn.text.split('\n')[0];
        assert.equal(held, `User: ${pasted.slice(0, 65_535)}`);
        // The query's window (the last 12 messages, the size unknown) holds the long one.
        host.chat.push(user('Where did Elena move?'));
        const packet = await memory.beforeGeneration(host.chat);
        assert.ok(packet, `memory query failed: ${memory.detail}`);
        assert.equal(memory.lastQuery.status, 200);
        // Half a character (a JavaScript string can hold one; the sidecar refuses it as no text):
        // remembered with U+FFFD in its place.
        host.chat.push(bot('Lisbon! \uD83D'));
        memory.onMessageReceived();
        await memory.settled();
        assert.ok(['committed', 'nothing_new'].includes(memory.status), memory.detail);
        const turns = await listTurns(host.getChatId());
        assert.deepEqual(turns.map((t) => t.turn_id), ['1', '3']);
        assert.match(turns[1].text, /Lisbon! \uFFFD$/);
    });

    test('a turn after long messages is remembered: its window keeps inside the sidecar\'s body', async () => {
        const host = fakeHost(`st-${Date.now()}-bulky`);
        const memory = memoryFor(host);
        const japanese = (n) => `${n} ${'東'.repeat(40_000)}`;  // 120 KB of JSON each
        host.chat.push(user(japanese(1)), bot(japanese(2)), user(japanese(3)), bot('ok'), user('hi'), bot('hello'));
        memory.onMessageReceived();
        await memory.settled();
        assert.ok(['committed', 'nothing_new'].includes(memory.status), memory.detail);
        assert.deepEqual((await listTurns(host.getChatId())).map((t) => t.turn_id), ['1', '3', '5']);
    });

    test('a chat imported in bulk (flows.dialogue ingest of its file) is found held: only what follows is written', async () => {
        const chatId = `st-${Date.now()}-imported`;
        const host = fakeHost(chatId);
        host.chat.push(bot('Welcome, traveler.'), user('My sister Ilse moved to Bergen.'), bot('Bergen! Rain.'),
            { name: 'System', is_system: true, mes: 'a note' }, user('She works at the fish market \uD83D'),
            user('and rents a flat.'), bot('I hope she likes fish.'), user('Not answered yet.'));
        // The chat file as SillyTavern saves it: a header line, then one message a line.
        const dir = mkdtempSync(join(tmpdir(), 'skald-st-chat-'));
        const file = join(dir, `${chatId}.jsonl`);
        const header = { user_name: 'User', character_name: 'Seraphina', create_date: '2023-05-08@13h00m00s', chat_metadata: {} };
        writeFileSync(file, [header, ...host.chat].map((line) => JSON.stringify(line)).join('\n') + '\n');
        const imported = spawnSync(python(), ['-m', 'flows.dialogue', 'ingest', '--project-dir', sidecar.project, '--dialogue', file], {
            cwd: repoRoot, encoding: 'utf8', timeout: 300_000,
            env: { ...process.env, SKALD_EMBEDDING_BASE_URL: sidecar.embedding_base_url },
        });
        assert.equal(imported.status, 0, imported.stderr.slice(-3000));
        const [report] = JSON.parse(imported.stdout);
        assert.deepEqual([report.conversation_id, report.turns, report.added], [chatId, 3, 3]);
        // The extension opens the chat: every imported turn is held as it would have written it.
        const memory = memoryFor(host);
        const calls = countCalls(memory.client);
        memory.onMessageReceived();
        await memory.settled();
        assert.equal(calls.replaceTurn, 0, memory.detail);
        host.chat.push(bot('Fish it is, then!'));
        memory.onMessageReceived();
        await memory.settled();
        assert.equal(calls.replaceTurn, 1, memory.detail);
        assert.deepEqual((await listTurns(chatId)).map((t) => t.turn_id), ['0', '2', '6', '8']);
    });

    test('a chat imported while the extension writes it: the write under way lands once, each turn held once', async () => {
        const chatId = `st-${Date.now()}-import-race`;
        const host = fakeHost(chatId);
        host.chat.push(user('My sister Ilse moved to Bergen.'), bot('Bergen! Rain.'), user('She works at the fish market.'),
            bot('I hope she likes fish.'), user('And rents a flat.'), bot('Nice.'));
        const memory = memoryFor(host);
        // The writer has read what memory holds (nothing) and is sending its first write...
        const send = memory.client.replaceTurn.bind(memory.client);
        let release;
        const held = new Promise((resolve) => { release = resolve; });
        let sending;
        const started = new Promise((resolve) => { sending = resolve; });
        memory.client.replaceTurn = async (...args) => {
            sending();
            await held;
            return send(...args);
        };
        memory.onMessageReceived();
        await started;
        // ... when the user imports the chat's file, as the badge suggests.
        const dir = mkdtempSync(join(tmpdir(), 'skald-st-chat-'));
        const file = join(dir, `${chatId}.jsonl`);
        const header = { user_name: 'User', character_name: 'Seraphina', chat_metadata: {} };
        writeFileSync(file, [header, ...host.chat].map((line) => JSON.stringify(line)).join('\n') + '\n');
        const imported = spawnSync(python(), ['-m', 'flows.dialogue', 'ingest', '--project-dir', sidecar.project, '--dialogue', file], {
            cwd: repoRoot, encoding: 'utf8', timeout: 300_000,
            env: { ...process.env, SKALD_EMBEDDING_BASE_URL: sidecar.embedding_base_url },
        });
        assert.equal(imported.status, 0, imported.stderr.slice(-3000));
        assert.equal(JSON.parse(imported.stdout)[0].added, 3);
        release();
        await memory.settled();
        assert.deepEqual(memory.outcomes.filter((o) => o.chatId === chatId).map((o) => [o.turnId, o.status]),
            [['1', 'committed'], ['3', 'committed'], ['5', 'committed']]);
        const turns = await listTurns(chatId);
        assert.deepEqual(turns.map((t) => t.turn_id), ['1', '3', '5']);
        assert.deepEqual(turns.map((t) => t.text), turnsOf(host.chat).map((t) => t.text));
    });

    test('a Continue (nothing pending) asks memory about the last message instead of clearing it', async () => {
        const host = fakeHost(`st-${Date.now()}-continue`);
        const memory = memoryFor(host);
        host.chat.push(user('My sister Elena moved to Lisbon to study marine biology!'), bot('How exciting, Lisbon!'),
            user('I baked bread this morning.'), bot('Does Elena like the ocean there?'));
        memory.onMessageReceived();
        await memory.settled();
        assert.deepEqual((await listTurns(host.getChatId())).map((t) => t.turn_id), ['1', '3']);
        // Continue: the prompt's chat is the whole chat, nothing after the last reply.
        const packet = await memory.beforeGeneration(host.chat);
        assert.ok(packet, `memory query failed: ${memory.detail}`);
        assert.match(host.prompt, /Lisbon/);
        // The look-alike: a chat with no message at all still asks nothing.
        const empty = fakeHost(`st-${Date.now()}-empty`);
        assert.equal(await memoryFor(empty).beforeGeneration(empty.chat), null);
        assert.equal(empty.prompt, '');
    });

    test('memory leaves last what the prompt holds: with its size known, the window is what fits', async () => {
        const host = fakeHost(`st-${Date.now()}-window`);
        const memory = memoryFor(host);
        // Turn 1 tells of Elena in Lisbon, turn 61 too; 59 turns of filler between and after.
        host.chat.push(user('My sister Elena moved to Lisbon to study marine biology!'), bot('How exciting, Lisbon!'));
        for (let i = 0; i < 59; i += 1) {
            if (i === 29) host.chat.push(user('Elena sent photos of Lisbon trams today.'), bot('Lisbon trams are lovely!'));
            else host.chat.push(user(`I had cup of tea number ${i} today.`), bot(`Enjoy tea number ${i}!`));
        }
        memory.onMessageReceived();
        await memory.settled();
        assert.equal((await listTurns(host.getChatId())).length, 60);
        host.chat.push(user('What do you remember about Elena and Lisbon?'));
        const lisbon = ['1', '61'];
        // Size unknown: the last 12 messages are the window; both turns are recalled.
        const unknown = await memory.beforeGeneration(host.chat);
        assert.equal(memory.lastQuery.window, 12);
        assert.deepEqual(lisbon.filter((t) => unknown.recalled_turns.includes(t)), lisbon);
        // A 3,400-token prompt holds the last 70-odd messages, turn 61's among them: memory brings
        // turn 1, which the prompt lacks, and leaves turn 61 for the others.
        const known = await memory.beforeGeneration(host.chat, 3400);
        assert.ok(memory.lastQuery.window > 60 && memory.lastQuery.window < 100, memory.lastQuery.window);
        assert.ok(known.recalled_turns.includes('1'), known.recalled_turns);
        assert.ok(!known.recalled_turns.includes('61'), known.recalled_turns);
        // A long card leaves less room: the window shrinks and turn 61 is recalled again.
        host.promptExtras = () => 'A knight of old. '.repeat(100);
        const carded = await memory.beforeGeneration(host.chat, 3400);
        assert.ok(memory.lastQuery.window > 0 && memory.lastQuery.window < 60, memory.lastQuery.window);
        assert.deepEqual(lisbon.filter((t) => carded.recalled_turns.includes(t)), lisbon);
        // A host that cannot read its prompt: the last 12 messages, and memory is still asked.
        host.promptExtras = () => { throw new TypeError('characters is undefined'); };
        const blind = await memory.beforeGeneration(host.chat, 3400);
        assert.equal(memory.lastQuery.window, 12);
        assert.deepEqual(lisbon.filter((t) => blind.recalled_turns.includes(t)), lisbon);
    });

    test('a swipe replaces the reply; an edit rewrites its turn and the later ones; a delete rewinds', async () => {
        const conversationId = `st-${Date.now()}-swipe`;
        const host = fakeHost(conversationId);
        const memory = memoryFor(host);
        host.chat.push(user('I adopted a cat named Pixel!'), bot('Pixel is a great name!'),
            user('She sleeps on my keyboard.'), bot('Classic cat behaviour!'));
        memory.onMessageReceived();
        await memory.settled();
        assert.deepEqual((await listTurns(conversationId)).map((t) => t.turn_id), ['1', '3']);

        // Nothing changed: nothing is sent again (the sidecar's replay count stays).
        const calls = countCalls(memory.client);
        memory.onMessageReceived();
        await memory.settled();
        assert.equal(calls.replaceTurn, 0);

        // Swipe the last reply to another alternative.
        host.chat[3] = bot('Keyboards are warm, that is why!');
        memory.onMessageSwiped(3);
        await memory.settled();
        let turns = await listTurns(conversationId);
        assert.deepEqual(turns.map((t) => t.text.split('\n')[1]), ['Seraphina: Pixel is a great name!', 'Seraphina: Keyboards are warm, that is why!']);

        // Edit the first user message: turn 1 is replaced (rewinding turn 3), turn 3 written again.
        host.chat[0] = user('I adopted a cat named Byte!');
        memory.onMessageEdited(0);
        await memory.settled();
        assert.equal(calls.replaceTurn, 3);
        turns = await listTurns(conversationId);
        assert.deepEqual(turns.map((t) => t.turn_id), ['1', '3']);
        assert.match(turns[0].text, /Byte/);

        // Delete the last two messages: the sidecar rewinds to before turn 3.
        host.chat.splice(2, 2);
        memory.onMessageDeleted(2);
        await memory.settled();
        assert.equal(calls.rewind, 1);
        assert.equal(memory.status, 'idle');
        assert.match(memory.detail, /rewound 1 turn\(s\) from turn 3/);
        assert.deepEqual((await listTurns(conversationId)).map((t) => t.turn_id), ['1']);

        // A reload: a new extension instance reads what memory holds and sends nothing.
        const reloaded = memoryFor(host);
        const after = countCalls(reloaded.client);
        reloaded.onChatChanged();
        await reloaded.settled();
        assert.deepEqual([after.replaceTurn, after.rewind], [0, 0]);
    });

    test('a deleted chat is forgotten once its writer has stopped; another chat, or the option off, keeps memory', async () => {
        const stamp = Date.now();
        const [deleted, kept, off] = [`st-${stamp}-deleted`, `st-${stamp}-kept`, `st-${stamp}-off`];
        const host = fakeHost(kept);
        const memory = memoryFor(host);
        host.chat.push(user('I adopted a dog named Biscuit.'), bot('Biscuit is a great name!'));
        memory.onChatChanged();
        await memory.settled();
        host.getChatId = () => deleted;
        memory.onChatChanged();
        await memory.settled();
        assert.equal((await listTurns(deleted)).length, 1);
        // A reply arrives, then SillyTavern deletes the chat (it opens another chat first) while
        // the reply's write is on its way: the forget waits for the writer, so nothing of the
        // chat comes back after it. The write is held until a forget has been answered, or for
        // 200 ms: a forget sent without waiting would land first and the write after it.
        let release;
        const held = new Promise((resolve) => { release = resolve; });
        const replaceTurn = memory.client.replaceTurn.bind(memory.client);
        memory.client.replaceTurn = async (...args) => {
            await held;
            return replaceTurn(...args);
        };
        const forget = memory.client.forget.bind(memory.client);
        memory.client.forget = async (...args) => {
            const answer = await forget(...args);
            release();
            return answer;
        };
        host.chat.push(user('He loves the beach.'), bot('Beach dogs are the best.'));
        memory.onMessageReceived();
        host.getChatId = () => kept;
        host.chat = [user('I adopted a dog named Biscuit.'), bot('Biscuit is a great name!')];
        setTimeout(release, 200);
        const forgetting = memory.onChatDeleted(deleted);
        assert.ok(forgetting instanceof Promise);
        assert.equal(memory.onChatDeleted(deleted), forgetting);
        const data = await forgetting;
        assert.ok(data.ok && data.found, JSON.stringify(data));
        assert.deepEqual(await listTurns(deleted), []);
        assert.match(memory.detail, /deleted chat forgotten/);
        assert.equal((await listTurns(kept)).length, 1);
        // Deleting it again finds nothing; the option off forgets nothing.
        assert.equal((await memory.onChatDeleted(deleted)).found, false);
        const keeper = memoryFor(fakeHost(off), { forgetDeletedChats: false });
        keeper.onChatChanged();
        await keeper.settled();
        assert.equal(keeper.onChatDeleted(kept), null);
        assert.equal((await listTurns(kept)).length, 1);
    });

    test('a forget the sidecar cannot take yet is retried, at once on the badge\'s click', async () => {
        const conversationId = `st-${Date.now()}-forget-retry`;
        const host = fakeHost(conversationId);
        const memory = memoryFor(host);
        host.chat.push(user('My brother Tomas plays the cello.'), bot('Lovely instrument!'));
        memory.onChatChanged();
        await memory.settled();
        host.getChatId = () => null;
        memory.client.baseUrl = 'http://127.0.0.1:9';
        const forgetting = memory.onChatDeleted(conversationId);
        try {
            while (memory.status !== 'error') await new Promise((resolve) => setTimeout(resolve, 10));
            assert.match(memory.detail, /forgetting a deleted chat: sidecar unreachable/);
            assert.equal((await listTurns(conversationId)).length, 1);
        } finally {
            memory.client.baseUrl = sidecar.url;
            memory.retryNow();
        }
        assert.ok((await forgetting).found);
        assert.deepEqual(await listTurns(conversationId), []);
    });

    test('a forget that had not landed when the page reloaded is sent again after the reload', async () => {
        const conversationId = `st-${Date.now()}-forget-reload`;
        const host = fakeHost(conversationId);
        let stored = [];
        host.loadPendingForgets = () => stored;
        host.savePendingForgets = (ids) => { stored = ids; };
        const memory = memoryFor(host);
        host.chat.push(user('My aunt Greta keeps bees in Uppsala.'), bot('How sweet!'));
        memory.onChatChanged();
        await memory.settled();
        host.getChatId = () => null;
        memory.client.baseUrl = 'http://127.0.0.1:9'; // the sidecar is down when the chat is deleted
        const first = memory.onChatDeleted(conversationId);
        try {
            while (memory.status !== 'error') await new Promise((resolve) => setTimeout(resolve, 10));
            assert.deepEqual(stored, [conversationId]);
            // The page reloads: a new instance over the same settings sends the forget again.
            const resumed = memoryFor(host).resumeForgets();
            assert.equal(resumed.length, 1);
            assert.ok((await resumed[0]).found);
            assert.deepEqual(stored, []);
            assert.deepEqual(await listTurns(conversationId), []);
            // The look-alike: nothing pending, nothing sent.
            assert.deepEqual(memoryFor(host).resumeForgets(), []);
        } finally {
            // The old page's forget, pointed at the sidecar again, finds nothing and ends (its
            // retries would otherwise keep the test process alive).
            memory.client.baseUrl = sidecar.url;
            memory.retryNow();
            assert.equal((await first).found, false);
        }
    });

    test('a renamed chat keeps its memory and its lorebook, a branch copies its memory: neither written again', async () => {
        const stamp = Date.now();
        const [named, renamed, branch, imported] = ['named', 'renamed', 'branch', 'imported'].map((n) => `st-${stamp}-${n}`);
        // SillyTavern as it renames and branches: each chat's metadata, and the chat files.
        const host = lorebookHost(named);
        let current = named;
        host.getChatId = () => current;
        const metadata = new Map();
        const files = new Set([named]);
        host.getChatMemory = () => metadata.get(current) ?? null;
        host.setChatMemory = async (record) => { metadata.set(current, { ...metadata.get(current), ...record }); };
        host.chatExists = async (id) => files.has(id);
        let owner = 'character:Seraphina.png';
        host.getChatOwner = () => owner;
        const memory = memoryFor(host, { chatLorebook: true });
        const calls = countCalls(memory.client);
        host.chat.push(user('My cousin Ada trains falcons in Tromsø.'), bot('Falcons!'),
            user('She named the eldest one Storm.'), bot('A fine name.'));
        memory.onChatChanged();
        await memory.settled();
        await lorebookSettled(memory);
        assert.equal(calls.replaceTurn, 2);
        const book = lorebookName(named);
        assert.deepEqual(metadata.get(named), { conversation_id: named, lorebook: book, owner });
        const whole = host.chat.slice();
        assert.deepEqual(host.offered.map((o) => [o.name, o.id]), [[book, named]]);
        // Renamed: the file moves, metadata and all; the chat reloads under its new id.
        files.delete(named);
        files.add(renamed);
        metadata.set(renamed, metadata.get(named));
        metadata.delete(named);
        current = renamed;
        memory.onChatChanged();
        await memory.settled();
        await lorebookSettled(memory);
        assert.equal(calls.replaceTurn, 2); // nothing written again
        assert.match(memory.outcome.detail, /renamed chat: 2 remembered turn\(s\) moved/);
        assert.deepEqual((await listTurns(renamed)).map((t) => t.turn_id), ['1', '3']);
        assert.deepEqual(await listTurns(named), []);
        assert.deepEqual(metadata.get(renamed), { conversation_id: renamed, lorebook: book, owner });
        // Its memory is offered to the book it is bound to, not to a new one.
        assert.deepEqual(host.offered.at(-1).name, book);
        assert.match(contents(host.offered.at(-1).book), /falcons/);
        // A branch from the first reply copies the metadata, but the chat it names still
        // exists: its memory is copied, and the turn the branch lacks rewound.
        files.add(branch);
        metadata.set(branch, { ...metadata.get(renamed), main_chat: renamed });
        current = branch;
        host.chat = host.chat.slice(0, 2);
        memory.onChatChanged();
        await memory.settled();
        await lorebookSettled(memory);
        assert.equal(calls.replaceTurn, 2); // nothing written again
        assert.equal(calls.rewind, 1);
        assert.deepEqual(memory.outcomes.filter((o) => o.chatId === branch).map((o) => [o.step, o.status]),
            [['copy', 'idle'], ['rewind', 'idle']]);
        assert.match(memory.outcomes.at(-2).detail, /branched chat: 2 remembered turn\(s\) copied/);
        assert.deepEqual((await listTurns(branch)).map((t) => t.turn_id), ['1']);
        assert.deepEqual((await listTurns(renamed)).map((t) => t.turn_id), ['1', '3']);
        assert.deepEqual(metadata.get(branch), { conversation_id: branch, lorebook: lorebookName(branch), owner, main_chat: renamed });
        assert.equal(host.offered.at(-1).name, lorebookName(branch)); // never the parent's book
        assert.doesNotMatch(contents(host.offered.at(-1).book), /Storm/);
        // The renamed chat's file imported into another character: the chat it names is not
        // among that character's chats, but it is not this one's to take: copied, not moved.
        owner = 'character:Other.png';
        files.clear();
        files.add(imported);
        metadata.set(imported, { ...metadata.get(renamed) });
        current = imported;
        host.chat = whole;
        memory.onChatChanged();
        await memory.settled();
        assert.equal(calls.replaceTurn, 2);
        assert.deepEqual(memory.outcomes.filter((o) => o.chatId === imported).map((o) => o.step), ['copy']);
        assert.deepEqual((await listTurns(imported)).map((t) => t.turn_id), ['1', '3']);
        assert.deepEqual((await listTurns(renamed)).map((t) => t.turn_id), ['1', '3']);
        assert.equal(metadata.get(imported).owner, owner);
    });

    test('a query during a pending edit holds the old text back; after the edit lands it recalls the new', async () => {
        const conversationId = `st-${Date.now()}-edit`;
        const host = fakeHost(conversationId);
        const memory = memoryFor(host, { waitBoundMs: 0 });
        host.chat.push(user('My sister Ilse moved to Bergen to study marine biology.'), bot('Bergen is lovely!'),
            user('The weather has been rainy all week, so I stayed in and read a novel about lighthouses.'), bot('Cosy!'));
        memory.onMessageReceived();
        await memory.settled();
        host.chat[2] = user('The weather has been sunny all week, so I went hiking up to the old lighthouse.');
        memory.onMessageEdited(2);
        host.chat.push(user('What did I do this week when the weather was rainy or sunny?'));
        await memory.beforeGeneration(host.chat);
        assert.deepEqual(memory.lastQuery.pendingTurns.map((p) => p.turn_id), ['3']);
        assert.doesNotMatch(host.prompt, /rainy all week/);
        assert.match(host.prompt, /Ilse/);
        await memory.settled();
        await memory.beforeGeneration(host.chat);
        assert.deepEqual(memory.lastQuery.pendingTurns, []);
        assert.match(host.prompt, /sunny all week/);
        assert.doesNotMatch(host.prompt, /rainy all week/);
    });

    test('a turn of pasted texts larger than a body is remembered as its newest messages that fit', async () => {
        const conversationId = `st-${Date.now()}-pasted`;
        const host = fakeHost(conversationId);
        const memory = memoryFor(host);
        // Three pasted texts of 192 KB each (a Japanese chapter apiece) before one reply.
        for (const first of ['0', '1', '2']) host.chat.push(user(`${first}${'東'.repeat(65_535)}`));
        host.chat.push(bot('So much to read!'));
        memory.onMessageReceived();
        await memory.settled();
        assert.deepEqual(memory.outcomes.filter((o) => o.status === 'error'), []);
        const [turn] = await listTurns(conversationId);
        assert.equal(turn.turn_id, '3');
        assert.match(turn.text, /^User: 2東{65535}\nSeraphina: So much to read!$/);
    });

    test('a hidden message is out of memory as it is out of the prompt; shown again, it is back', async () => {
        const conversationId = `st-${Date.now()}-hide`;
        const host = fakeHost(conversationId);
        const memory = memoryFor(host, { waitBoundMs: 0 });
        host.chat.push(user('My sister Ilse moved to Bergen.'), bot('Bergen is lovely!'),
            user('I adopted a grey cat named Pixel.'), bot('What a lovely pet!'),
            user('The weather is dull today.'), bot('Stay warm!'));
        memory.onMessageReceived();
        await memory.settled();
        const before = await listTurns(conversationId);
        assert.match(before.find((t) => t.turn_id === '3').text, /Pixel/);
        host.chat.push(user('What is the name of the cat I adopted?'));
        await memory.beforeGeneration(host.chat);
        assert.match(host.prompt, /Pixel/);
        // SillyTavern's /hide marks the message is_system and emits no event: the next
        // generation finds it, holds the turn's old text back, and the writer rewrites it.
        host.chat[2].is_system = true;
        await memory.beforeGeneration(host.chat);
        assert.deepEqual(memory.lastQuery.pendingTurns.map((p) => p.turn_id), ['3']);
        assert.doesNotMatch(host.prompt, /Pixel/);
        await memory.settled();
        const hidden = await listTurns(conversationId);
        assert.deepEqual(hidden.map((t) => t.turn_id), ['1', '3', '5']);
        assert.doesNotMatch(hidden.map((t) => t.text).join('\n'), /Pixel/);
        assert.match(hidden.find((t) => t.turn_id === '1').text, /Ilse/);
        host.chat[2].is_system = false;
        memory.onChatChanged();
        await memory.settled();
        const shown = await listTurns(conversationId);
        assert.deepEqual(shown.map((t) => [t.turn_id, t.text]), before.map((t) => [t.turn_id, t.text]));
    });

    test('a chat catching up on hundreds of turns is still answered: the pending turns fit the body', async () => {
        const conversationId = `st-${Date.now()}-catch-up`;
        const host = fakeHost(conversationId);
        // The import off: the writer goes turn by turn, as a sidecar without it has it.
        const memory = memoryFor(host, { waitBoundMs: 0, importHistory: false });
        host.chat.push(user('My sister Ilse moved to Bergen to study marine biology.'), bot('Bergen is lovely!'));
        memory.onMessageReceived();
        await memory.settled();
        // 250 turns of 2 KB memory does not hold yet (an old chat the extension meets, or a
        // sidecar that was down), and the writer held at the first of them: every query lists
        // them as pending turns. Their texts are 500 KB, the body's limit 320 KB.
        for (let i = 0; i < 250; i++) {
            host.chat.push(user(`Day ${i}: `.padEnd(800, 'u')), bot(`Noted ${i}. `.padEnd(1200, 'r')));
        }
        memory.client.replaceTurn = () => new Promise(() => {});  // never lands (nothing awaits it)
        host.chat.push(user('Where does my sister Ilse live now?'));
        await memory.beforeGeneration(host.chat);
        assert.equal(memory.lastQuery.status, 200);
        assert.match(host.prompt, /Ilse moved to Bergen/);
        // The badge names the bulk import of the chat's file, which would take them at once.
        assert.match(memory.detail, new RegExp(`^250 pending; .*flows\\.dialogue ingest --dialogue "${conversationId}\\.jsonl"`));
        const listed = memory.lastQuery.pendingTurns;
        assert.equal(listed.length, 200);
        assert.ok(jsonBytes(listed) <= MAX_PENDING_TURN_BYTES, jsonBytes(listed));
        // The newest turns go with their text, the older as null (held back, none held yet).
        const turns = turnsOf(host.chat);
        assert.equal(listed.at(-1).text, turns.at(-1).text);
        assert.equal(listed[0].turn_id, String(turns.at(-200).turnId));
        assert.equal(listed[0].text, null);
        assert.ok(listed.filter((p) => p.text !== null).length >= 10);
    });

    test('a chat far behind memory has its older turns imported at once as text; the newest go through the LLM slots', async () => {
        const chatId = `st-${Date.now()}-far-behind`;
        const host = fakeHost(chatId);
        host.chat.push(user('My sister Ilse moved to Bergen to study marine biology.'), bot('Bergen is lovely!'));
        for (let i = 1; i < 60; i++) host.chat.push(user(`Day ${i}: a quiet day at the library.`), bot(`Noted, day ${i}.`));
        const memory = memoryFor(host);
        const calls = countCalls(memory.client);
        const badges = [];
        host.onStatus = (status) => badges.push(memory.detail);
        memory.onMessageReceived();
        await memory.settled();
        // 60 turns behind: the oldest 40 in one import, the newest 20 through the LLM slots.
        assert.deepEqual([calls.importTurns, calls.replaceTurn], [1, IMPORT_KEEP_TURNS]);
        const outcomes = memory.outcomes.filter((o) => o.chatId === chatId);
        assert.deepEqual([outcomes[0].step, outcomes[0].status], ['import', 'committed']);
        assert.equal(outcomes[0].detail, 'imported turns 1-79 as text (no facts): 40 added');
        assert.ok(badges.some((b) => /^60 pending; importing 40 older turn\(s\) as text/.test(b)), badges.join('\n'));
        // Memory holds every turn as the extension would have written it, in the chat's order.
        const turns = await listTurns(chatId);
        assert.deepEqual(turns.map((t) => t.turn_id), turnsOf(host.chat).map((t) => String(t.turnId)));
        assert.deepEqual(turns.map((t) => t.text), turnsOf(host.chat).map((t) => t.text));
        host.chat.push(user('Where does my sister Ilse live now?'));
        await memory.beforeGeneration(host.chat);
        assert.match(host.prompt, /Ilse moved to Bergen/);
        // Caught up, a new turn is written through the slots as ever.
        host.chat.push(bot('In Bergen, by the sea.'));
        memory.onMessageReceived();
        await memory.settled();
        assert.deepEqual([calls.importTurns, calls.replaceTurn], [1, IMPORT_KEEP_TURNS + 1]);
    });

    test('a sidecar that refuses the import (an older one has none) gets the turns one by one', async () => {
        const chatId = `st-${Date.now()}-no-import`;
        const host = fakeHost(chatId);
        for (let i = 0; i < IMPORT_HINT_TURNS; i++) host.chat.push(user(`Day ${i}.`), bot(`Noted, day ${i}.`));
        const memory = memoryFor(host);
        const calls = countCalls(memory.client);
        memory.client.importTurns = async () => ({ status: 404, data: { detail: 'Not Found' } });
        memory.onMessageReceived();
        await memory.settled();
        assert.equal(calls.replaceTurn, IMPORT_HINT_TURNS);
        const outcomes = memory.outcomes.filter((o) => o.chatId === chatId);
        assert.deepEqual([outcomes[0].step, outcomes[0].status], ['import', 'error']);
        assert.match(outcomes[0].detail, /^import refused, writing turn by turn: HTTP 404/);
        assert.equal((await listTurns(chatId)).length, IMPORT_HINT_TURNS);
    });

    test('a write that fails shows the error badge and lands once the sidecar answers again', async () => {
        const conversationId = `st-${Date.now()}-retry`;
        const host = fakeHost(conversationId);
        const memory = new SkaldMemory(host, { baseUrl: 'http://127.0.0.1:9', token: sidecar.token, retryBaseMs: 50, retryMaxMs: 200 });
        host.chat.push(user('I planted tomatoes in the garden today!'), bot('Lovely, tomatoes!'));
        memory.onMessageReceived();
        while (memory.status !== 'error') await new Promise((resolve) => setTimeout(resolve, 20));
        assert.match(memory.detail, /unreachable.*retrying in/);
        memory.client.baseUrl = sidecar.url;  // the sidecar is back
        memory.retryNow();
        await memory.settled();
        assert.ok(['committed', 'nothing_new'].includes(memory.status), memory.detail);
        assert.deepEqual((await listTurns(conversationId)).map((t) => t.turn_id), ['1']);
    });

    test('an unreachable sidecar shows the error badge and clears the prompt', async () => {
        const host = fakeHost('st-unreachable');
        const memory = new SkaldMemory(host, { baseUrl: 'http://127.0.0.1:9', token: 'x', waitBoundMs: 0, retryBaseMs: 60_000 });
        host.chat.push(user('hello?'));
        host.prompt = 'stale memory';
        assert.equal(await memory.beforeGeneration(host.chat), null);
        assert.equal(memory.status, 'error');
        assert.equal(host.prompt, '');
        memory.settings.enabled = false;  // stop its writer's retries
        memory.retryNow();
    });

    /** Waits for the chat's lorebook refreshes (the background ones the writer started). */
    async function lorebookSettled(memory) {
        for (;;) {
            const running = memory.currentChat()?.lorebookRunning;
            if (!running) return;
            await running;
        }
    }

    /** A host whose offerLorebook records what it was given (or does `behaviour` instead). */
    function lorebookHost(chatId, behaviour = null) {
        const host = fakeHost(chatId);
        host.offered = [];
        host.offerLorebook = async (name, book, id) => {
            host.offered.push({ name, book, id });
            return behaviour ? behaviour() : 'bound';
        };
        return host;
    }

    const contents = (book) => Object.values(book.entries).map((e) => e.content).join('\n');

    test('the chat lorebook is off by default: nothing is offered', async () => {
        const host = lorebookHost(`st-${Date.now()}-lore-off`);
        const memory = memoryFor(host);
        assert.equal(memory.settings.chatLorebook, false);
        host.chat.push(user('My brother Tomas moved to Porto last winter!'), bot('Porto, wonderful!'));
        memory.onMessageReceived();
        await memory.settled();
        assert.equal(memory.currentChat().lorebookRunning, null);
        assert.deepEqual([host.offered.length, memory.lastLorebook], [0, null]);
    });

    test('on: once memory holds the chat its lorebook is offered, and offered again after an edit', async () => {
        const conversationId = `st-${Date.now()}-lore-on`;
        const host = lorebookHost(conversationId);
        const memory = memoryFor(host, { chatLorebook: true });
        // Nothing in memory yet: the sidecar has no book (404), nothing is offered.
        host.chat.push(user('hello?'));
        memory.onChatChanged();
        await memory.settled();
        await lorebookSettled(memory);
        assert.equal(memory.lastLorebook.status, 'empty');
        assert.equal(host.offered.length, 0);

        host.chat.push(bot('Hello there!'), user('My brother Tomas moved to Porto last winter!'), bot('How lovely!'));
        memory.onMessageReceived();
        await memory.settled();
        await lorebookSettled(memory);
        const offered = host.offered.at(-1);
        assert.equal(offered.name, lorebookName(conversationId));
        assert.equal(offered.id, conversationId);
        // SillyTavern's layout: entries keyed by uid; the speaker's entry keyed by its name holds the fact.
        const entry = Object.values(offered.book.entries).find((e) => e.key.includes('User'));
        assert.ok(entry, JSON.stringify(offered.book));
        assert.equal(offered.book.entries[String(entry.uid)], entry);
        assert.match(entry.content, /My brother Tomas moved to Porto last winter!/);
        assert.deepEqual([memory.lastLorebook.status, memory.lastLorebook.detail], ['offered', 'bound']);

        // The edit lands, then the book is offered again: the new text in, the old one out.
        const before = host.offered.length;
        host.chat[2] = user('My brother Tomas moved to Madrid last winter!');
        memory.onMessageEdited(2);
        await memory.settled();
        await lorebookSettled(memory);
        assert.ok(host.offered.length > before);
        assert.match(contents(host.offered.at(-1).book), /Tomas moved to Madrid/);
        assert.doesNotMatch(contents(host.offered.at(-1).book), /Porto/);
    });

    test('a deleted chat\'s lorebook is deleted with its memory; another chat\'s, or with forgetting off, stays', async () => {
        const stamp = Date.now();
        const [gone, kept, renamed] = [`st-${stamp}-lore-gone`, `st-${stamp}-lore-kept`, `st-${stamp}-lore-renamed`];
        const host = lorebookHost(gone);
        const books = new Set(['a book of the user']);
        const offer = host.offerLorebook;
        host.offerLorebook = async (name, book, id) => {
            books.add(name);
            return offer(name, book, id);
        };
        host.deleteLorebook = async (name) => books.delete(name);
        const memory = memoryFor(host, { chatLorebook: true });
        host.chat.push(user('My brother Tomas moved to Porto last winter!'), bot('How lovely!'));
        memory.onMessageReceived();
        await memory.settled();
        await lorebookSettled(memory);
        host.getChatId = () => kept;
        memory.onChatChanged();
        await memory.settled();
        await lorebookSettled(memory);
        assert.deepEqual([...books].sort(), ['a book of the user', lorebookName(gone), lorebookName(kept)].sort());
        await memory.onChatDeleted(gone);
        assert.deepEqual([...books].sort(), ['a book of the user', lorebookName(kept)].sort());
        assert.match(memory.detail, new RegExp(`^deleted chat forgotten: 1 remembered turn\\(s\\); its lorebook "${lorebookName(gone)}" deleted$`));
        // A chat this page never saw, whose book the host recorded under its first name (renamed since).
        books.add('Skald_memory_first_name');
        host.lorebookOf = (id) => (id === renamed ? 'Skald_memory_first_name' : null);
        await memory.onChatDeleted(renamed);
        assert.ok(!books.has('Skald_memory_first_name'));
        // Forgetting off: the chat's memory and its book stay.
        const keeper = memoryFor(host, { chatLorebook: true, forgetDeletedChats: false });
        assert.equal(keeper.onChatDeleted(kept), null);
        assert.ok(books.has(lorebookName(kept)) && books.has('a book of the user'));
    });

    test('a lorebook that fails or never lands never holds the chat up', async () => {
        const failing = lorebookHost(`st-${Date.now()}-lore-fail`, () => {
            throw new Error('World Info save refused');
        });
        const memory = memoryFor(failing, { chatLorebook: true });
        failing.chat.push(user('I planted basil on the balcony!'), bot('Basil smells great!'));
        memory.onMessageReceived();
        await memory.settled();
        await lorebookSettled(memory);
        assert.deepEqual([memory.lastLorebook.status, memory.lastLorebook.detail], ['error', 'World Info save refused']);
        // The badge is about memory, which holds the turn.
        assert.ok(['committed', 'nothing_new'].includes(memory.status), memory.detail);

        const stuck = lorebookHost(`st-${Date.now()}-lore-stuck`, () => new Promise(() => {}));
        const stalled = memoryFor(stuck, { chatLorebook: true });
        stuck.chat.push(user('My neighbour Ines keeps bees!'), bot('Bees, how lovely!'));
        stalled.onMessageReceived();
        await stalled.settled();
        // Offered (once the sidecar's book arrived), and never answered.
        while (stuck.offered.length === 0) await new Promise((resolve) => setTimeout(resolve, 20));
        assert.ok(stalled.currentChat().lorebookRunning);
        // The next message is written and recalled as if there were no lorebook at all.
        stuck.chat.push(user('Do you remember who keeps bees?'), bot('Ines does!'));
        const running = stalled.onMessageReceived();
        assert.ok(running instanceof Promise);
        await stalled.settled();
        assert.deepEqual((await listTurns(stuck.getChatId())).map((t) => t.turn_id), ['1', '3']);
        stuck.chat.push(user('And who keeps bees again?'));
        assert.ok(await stalled.beforeGeneration(stuck.chat), stalled.detail);
        assert.match(stuck.prompt, /Ines/);
    });
});
