/**
 * The shape of a CLI command (`mod.ts` dispatches to one per name): kept apart from `mod.ts` so that the
 * commands do not import the entry that imports them.
 * @module
 */

/** A CLI command: its one-line help and its entry taking the remaining argv. */
export interface Command {
  /** One line for `mod.ts help`. */
  readonly summary: string;
  /** Full help text for `mod.ts <command> --help` (or `-h`); without it the summary is printed. */
  readonly usage?: string;
  /** Runs the command; resolves to the process exit code. */
  readonly run: (argv: string[]) => Promise<number>;
}
