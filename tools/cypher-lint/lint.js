#!/usr/bin/env node
// Lints every Cypher statement Skald sends with Neo4j's own front end
// (`@neo4j-cypher/language-support`, pinned in package.json): Neo4j's parser plus its
// semantic analysis, with the statement's parameters declared and the vocabulary's labels and
// relationship types as the schema. Functions and procedures are checked against the
// catalogue of a Neo4j 5 server that the package itself ships (its `testData` dump of
// `SHOW FUNCTIONS` / `SHOW PROCEDURES`); APOC entries are dropped because Skald needs no plugin.
//
// Input: JSON lines, one statement each:
//   {"text": "...", "param_sets": [["a", "b"], ...], "origin": "recorded" | "neo4j-only: ...",
//    "labels": [...], "relationship_types": [...]}   (a line with "vocabulary" only is allowed)
// Each text is linted once per distinct set of parameter names it was sent with, under
// CYPHER 5 (what a Neo4j 5 server runs) and CYPHER 25 (what newer servers move to).
// Exit 1 on any error or on a warning not listed in accepted-warnings.json; every warning is
// printed, the accepted ones with their reason.
'use strict';

const fs = require('fs');
const path = require('path');

const PACKAGE = '@neo4j-cypher/language-support';
const HERE = __dirname;
const VERSIONS = ['CYPHER 5', 'CYPHER 25'];

function usage(message) {
  process.stderr.write(`cypher-lint: ${message}\n`);
  process.stderr.write('usage: node tools/cypher-lint/lint.js STATEMENTS.jsonl [--accepted FILE]\n');
  process.exit(2);
}

function loadPackage() {
  try {
    return require(PACKAGE);
  } catch (err) {
    usage(`${PACKAGE} is not installed (${err.code || err.message}): run \`npm ci --prefix tools/cypher-lint\``);
  }
}

function packageRoot() {
  const pkgMain = require.resolve(PACKAGE);
  return pkgMain.slice(0, pkgMain.indexOf(path.join('dist', 'cjs')));
}

async function loadCatalogue() {
  // The package's own dump of a Neo4j 5 server's functions and procedures, per Cypher version.
  const pkgRoot = packageRoot();
  const dataPath = path.join(pkgRoot, 'dist', 'esm', 'project', 'language-support', 'src', 'tests', 'testData.js');
  const { testData } = await import(require('url').pathToFileURL(dataPath).href);
  const noPlugins = (registry) =>
    Object.fromEntries(Object.entries(registry).filter(([name]) => !name.toLowerCase().startsWith('apoc.')));
  const functions = {};
  const procedures = {};
  for (const version of VERSIONS) {
    functions[version] = noPlugins(testData.mockSchema.functions[version] || {});
    procedures[version] = noPlugins(testData.mockSchema.procedures[version] || {});
  }
  return { functions, procedures };
}

function readStatements(file) {
  let raw;
  try {
    raw = fs.readFileSync(file, 'utf8');
  } catch (err) {
    usage(`cannot read ${file} (${err.code}): run the test suite first (it writes the statements there)`);
  }
  const statements = [];
  const labels = new Set();
  const relTypes = new Set();
  raw.split('\n').forEach((line, i) => {
    if (!line.trim()) return;
    let item;
    try {
      item = JSON.parse(line);
    } catch (err) {
      usage(`${file}:${i + 1} is not JSON (${err.message})`);
    }
    (item.labels || []).forEach((l) => labels.add(l));
    (item.relationship_types || []).forEach((t) => relTypes.add(t));
    if (typeof item.text === 'string') statements.push(item);
  });
  return { statements, labels: [...labels], relTypes: [...relTypes] };
}

function readAccepted(file) {
  if (!fs.existsSync(file)) return [];
  const accepted = JSON.parse(fs.readFileSync(file, 'utf8'));
  for (const entry of accepted) {
    if (!entry.message || !entry.reason) usage(`${file}: every entry needs "message" and "reason"`);
  }
  return accepted;
}

function oneLine(text) {
  return text.replace(/\s+/g, ' ').trim();
}

async function main() {
  const args = process.argv.slice(2);
  let acceptedFile = path.join(HERE, 'accepted-warnings.json');
  const files = [];
  for (let i = 0; i < args.length; i++) {
    if (args[i] === '--accepted') acceptedFile = args[++i];
    else if (args[i] === '--help' || args[i] === '-h') usage('lints the statements a test run recorded');
    else files.push(args[i]);
  }
  if (files.length !== 1) usage('give exactly one statements file');

  const { lintCypherQuery } = loadPackage();
  const catalogue = await loadCatalogue();
  const { statements, labels, relTypes } = readStatements(files[0]);
  const accepted = readAccepted(acceptedFile);
  if (statements.length === 0) usage(`${files[0]} holds no statements`);

  let errors = 0;
  let rejectedWarnings = 0;
  const warningsSeen = new Map(); // message -> {reason, count}
  const origins = new Map();
  const failing = new Set();
  for (const statement of statements) {
    const origin = statement.origin || 'recorded';
    const kind = origin.startsWith('neo4j-only') ? 'neo4j-only' : 'recorded';
    origins.set(kind, (origins.get(kind) || 0) + 1);
    const paramSets = statement.param_sets && statement.param_sets.length ? statement.param_sets : [[]];
    const reported = new Set();
    for (const params of paramSets) {
      for (const version of VERSIONS) {
        const dbSchema = {
          labels,
          relationshipTypes: relTypes,
          parameters: Object.fromEntries(params.map((p) => [p, null])),
          functions: catalogue.functions,
          procedures: catalogue.procedures,
          defaultLanguage: version,
        };
        const { diagnostics } = lintCypherQuery(statement.text, dbSchema);
        for (const d of diagnostics) {
          const where = statement.text.slice(d.offsets.start, d.offsets.end);
          const key = `${d.severity}|${d.message}|${where}|${params.join(',')}`;
          if (reported.has(key)) continue;
          reported.add(key);
          const head = `  ${oneLine(statement.text)}\n    (${origin}; ${version}; parameters: ${params.join(', ') || 'none'})`;
          if (d.severity === 1) {
            errors++;
            failing.add(statement.text);
            console.log(`ERROR ${oneLine(d.message)} at ${JSON.stringify(where)}\n${head}`);
            continue;
          }
          const rule = accepted.find((a) => d.message.includes(a.message));
          if (rule) {
            const seen = warningsSeen.get(rule.message) || { reason: rule.reason, count: 0 };
            seen.count++;
            warningsSeen.set(rule.message, seen);
            console.log(`warning (accepted: ${rule.reason}) ${oneLine(d.message)}\n${head}`);
          } else {
            rejectedWarnings++;
            failing.add(statement.text);
            console.log(`WARNING (not in ${path.basename(acceptedFile)}) ${oneLine(d.message)} at ${JSON.stringify(where)}\n${head}`);
          }
        }
      }
    }
  }
  const byKind = [...origins.entries()].map(([k, n]) => `${n} ${k}`).join(', ');
  console.log(
    `cypher-lint: ${statements.length} distinct statements (${byKind}), linted as ${VERSIONS.join(' and ')} ` +
      `with ${PACKAGE}@${JSON.parse(fs.readFileSync(path.join(packageRoot(), 'package.json'), 'utf8')).version}: ${errors} errors, ` +
      `${rejectedWarnings} unaccepted warnings, ${[...warningsSeen.values()].reduce((a, w) => a + w.count, 0)} accepted warnings`,
  );
  for (const [message, w] of warningsSeen) console.log(`  accepted x${w.count}: "${message}": ${w.reason}`);
  if (errors || rejectedWarnings) {
    console.log(`cypher-lint: FAILED: ${failing.size} statement(s) Neo4j would refuse or warn about:`);
    for (const text of failing) console.log(`  ${oneLine(text).slice(0, 400)}`);
    console.log('cypher-lint: fix them in kg/, or list a warning in accepted-warnings.json with its reason');
    process.exit(1);
  }
}

main().catch((err) => {
  process.stderr.write(`cypher-lint: ${err.stack || err}\n`);
  process.exit(2);
});
