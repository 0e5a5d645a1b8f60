/**
 * Where the committed llama.cpp fixtures live (`tests/fixtures/`, see its SOURCE.md).
 * @module
 */

/** Folder URL of the fixtures, ending in `/`. */
export const FIXTURES: URL = new URL("../fixtures/", import.meta.url);

/** Filesystem path of fixture `name`. */
export function fixturePath(name: string): string {
  return new URL(name, FIXTURES).pathname;
}
