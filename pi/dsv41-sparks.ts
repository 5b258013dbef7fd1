// dsv41-sparks: send no output-token limit to the dsv41-sparks provider, so answers end naturally
// (the server bounds them by its max model length). Other providers are left alone.
import type { ExtensionAPI } from "@earendil-works/pi-coding-agent";

export default function (pi: ExtensionAPI) {
	pi.on("before_provider_request", (event, ctx) => {
		if (ctx.model?.provider !== "dsv41-sparks") return undefined;
		const payload = event.payload as Record<string, unknown> | undefined;
		if (!payload || typeof payload !== "object") return undefined;
		if (!("max_tokens" in payload) && !("max_completion_tokens" in payload)) return undefined;
		const { max_tokens: _a, max_completion_tokens: _b, ...rest } = payload;
		return rest;
	});
}
