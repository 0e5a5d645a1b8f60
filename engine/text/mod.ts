/**
 * Text side of the engine: the tokenizer built from a GGUF's `tokenizer.ggml.*` metadata (byte-level BPE,
 * `qwen2`/`qwen35` pre-tokenizers, added tokens, end-of-generation ids) and the streaming decoder.
 *
 * @example
 * ```ts
 * import { openGguf } from "../gguf.ts";
 * import { Tokenizer } from "./mod.ts";
 * const tok = Tokenizer.fromGguf((await openGguf("vocab-qwen3.gguf")).metadata);
 * const ids = tok.encode("<|im_start|>user\nhi<|im_end|>", { parseSpecial: true });
 * const dec = tok.incrementalDecoder();
 * let text = "";
 * for (const id of ids) text += dec.push(id);
 * text += dec.flush();
 * ```
 * @module
 */
export {
  type DecodeOptions,
  DEFUSE_MARK,
  type EncodeOptions,
  IncrementalDecoder,
  PRE_TOKENIZERS,
  type PreTokenizerName,
  TOKEN_TYPE,
  Tokenizer,
  type TokenizerVocab,
  type TokenType,
} from "./tokenizer.ts";
export {
  BUILTIN_TEMPLATES,
  type ChatMessage,
  type ChatRenderRequest,
  type ChatRole,
  ChatTemplate,
  ChatTemplateError,
  type ChatTemplateErrorCode,
  type ChatToolCall,
  type JsonSchema,
  type ModelKind,
  opensThinking,
  QWEN35_TEMPLATE,
  QWEN3_TEMPLATE,
  renderChat,
  type ToolSpec,
} from "./template.ts";
export { type ChatPrompt, defuseRequest, renderPrompt, type RenderPromptOptions } from "./prompt.ts";
export {
  type ChatEvent,
  type ChatOutput,
  type ChatParseOptions,
  ChatStreamParser,
  convertParameter,
  parseChatOutput,
  type ParsedToolCall,
  parseToolCallBody,
} from "./tool_calls.ts";
export { STOP_REASONS, StopMatcher, type StopPush, type StopReason } from "./stop.ts";
