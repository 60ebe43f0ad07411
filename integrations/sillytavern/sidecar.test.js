// `node --test integrations/sillytavern/`: the extension's logic against the real sidecar,
// served on loopback by serve_for_tests.py (scripted model, real graph, real HTTP server).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { SidecarClient, SkaldMemory, pendingOf, turnsOf } from './sidecar-core.js';

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

function memoryFor(host) {
    return new SkaldMemory(host, { baseUrl: sidecar.url, token: sidecar.token });
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
        const { pending, window } = pendingOf(chat);
        assert.deepEqual(pending.map((m) => m.content), ['next']);
        assert.equal(window.length, 5);
        assert.deepEqual(pendingOf([user('only')]).pending.map((m) => m.content), ['only']);
    });
});

describe('against the real sidecar', () => {
    test('no token: 401; the token: 200', async () => {
        const anonymous = new SidecarClient({ baseUrl: sidecar.url });
        assert.equal((await anonymous.health()).status, 401);
        const authorised = new SidecarClient({ baseUrl: sidecar.url, token: sidecar.token });
        assert.equal((await authorised.health()).status, 200);
    });

    test('memory before generation holds what an earlier turn committed', async () => {
        const host = fakeHost(`st-${Date.now()}-memory`);
        const memory = memoryFor(host);
        host.chat.push(user('My sister Elena moved to Lisbon to study marine biology!'), bot('How exciting, Lisbon!'));
        const results = await memory.onMessageReceived();
        assert.equal(results.length, 1);
        assert.equal(results[0].data.committed, true);
        assert.equal(memory.status, 'committed');

        host.chat.push(user('Where did Elena move again?'));
        const packet = await memory.beforeGeneration(host.chat);
        assert.ok(packet, `memory query failed: ${memory.detail}`);
        assert.match(host.prompt, /Lisbon/);
        assert.deepEqual(packet.recalled_turns, ['1']);
        assert.equal(memory.status, 'idle');
        assert.ok(host.statuses.includes('syncing'));
    });

    test('a swipe replaces the reply; an edit re-commits its turn and the later ones; a delete rewinds', async () => {
        const conversationId = `st-${Date.now()}-swipe`;
        const host = fakeHost(conversationId);
        const memory = memoryFor(host);
        host.chat.push(user('I adopted a cat named Pixel!'), bot('Pixel is a great name!'),
            user('She sleeps on my keyboard.'), bot('Classic cat behaviour!'));
        await memory.onMessageReceived();
        assert.deepEqual((await listTurns(conversationId)).map((t) => t.turn_id), ['1', '3']);

        // Nothing changed: no commit is sent again.
        assert.deepEqual(await memory.onMessageReceived(), []);

        // Swipe the last reply to another alternative.
        host.chat[3] = bot('Keyboards are warm, that is why!');
        const swiped = await memory.onMessageSwiped(3);
        assert.equal(swiped.length, 1);
        assert.equal(swiped[0].data.committed, true);
        let turns = await listTurns(conversationId);
        assert.deepEqual(turns.map((t) => t.text.split('\n')[1]), ['Seraphina: Pixel is a great name!', 'Seraphina: Keyboards are warm, that is why!']);

        // Edit the first user message: turn 1 is replaced (rewinding turn 3), turn 3 committed again.
        host.chat[0] = user('I adopted a cat named Byte!');
        const edited = await memory.onMessageEdited(0);
        assert.deepEqual(edited.map((r) => [r.turnId, r.data.committed]), [[1, true], [3, true]]);
        turns = await listTurns(conversationId);
        assert.deepEqual(turns.map((t) => t.turn_id), ['1', '3']);
        assert.match(turns[0].text, /Byte/);

        // Delete the last two messages: the sidecar rewinds to before turn 3.
        host.chat.splice(2, 2);
        const rewound = await memory.onMessageDeleted(2);
        assert.deepEqual(rewound.removed_turns, ['3']);
        assert.equal(memory.status, 'rollback');
        assert.deepEqual((await listTurns(conversationId)).map((t) => t.turn_id), ['1']);
    });

    test('an unreachable sidecar shows the error badge and clears the prompt', async () => {
        const host = fakeHost('st-unreachable');
        const memory = new SkaldMemory(host, { baseUrl: 'http://127.0.0.1:9', token: 'x' });
        host.chat.push(user('hello?'));
        host.prompt = 'stale memory';
        assert.equal(await memory.beforeGeneration(host.chat), null);
        assert.equal(memory.status, 'error');
        assert.equal(host.prompt, '');
    });
});
