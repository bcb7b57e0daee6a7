"""``search``: retrieval over a local corpus with BM25 (Search-R1 style tool, no retrieval server).

verl's search tool calls an HTTP retrieval service (dense E5 index); that needs a GPU box and a download.
Here the user points ``config.corpus_path`` at a jsonl file of ``{"id": ..., "contents": ...}`` rows (the
format of the Search-R1 wiki corpus) and we rank with Okapi BM25 (Robertson & Zaragoza, "The Probabilistic
Relevance Framework: BM25 and Beyond", 2009):

    score(D, Q) = sum_{t in Q} idf(t) * tf(t, D) * (k1 + 1) / (tf(t, D) + k1 * (1 - b + b * |D| / avgdl))
    idf(t)      = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

(the "+1" inside the log keeps idf positive for very common terms, as Lucene does). Pure Python, an inverted
index built once per tool, so a call costs only the postings of the query terms.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass

from hybridflow.tools.base_tool import BaseTool, ExecuteResult, error_result, parse_tool_config, register_tool
from hybridflow.tools.schemas import ToolResponse

_TOKEN = re.compile(r"\w+")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


class BM25Index:
    """Inverted index over ``docs`` (dicts with ``contents``) answering top-k BM25 queries."""

    def __init__(self, docs: list[dict], k1: float = 1.5, b: float = 0.75):
        if not docs:
            raise ValueError("BM25Index needs at least one document")
        self.docs = docs
        self.k1 = k1
        self.b = b
        self.postings: dict[str, list[tuple[int, int]]] = {}
        self.lengths: list[int] = []
        for i, doc in enumerate(docs):
            counts = Counter(tokenize(doc["contents"]))
            self.lengths.append(sum(counts.values()))
            for term, tf in counts.items():
                self.postings.setdefault(term, []).append((i, tf))
        self.avgdl = sum(self.lengths) / len(docs) or 1.0

    @classmethod
    def from_jsonl(cls, path: str, k1: float = 1.5, b: float = 0.75) -> "BM25Index":
        if not os.path.isfile(path):
            raise FileNotFoundError(f"search corpus_path {path!r} does not exist; write a jsonl of "
                                    '{"id": ..., "contents": ...} rows and point config.corpus_path at it')
        docs = []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
                if not isinstance(row, dict) or not isinstance(row.get("contents"), str):
                    raise ValueError(f"{path}:{lineno}: each row needs a string field 'contents' (and an 'id')")
                docs.append({"id": row.get("id", str(lineno - 1)), "contents": row["contents"]})
        return cls(docs, k1=k1, b=b)

    def idf(self, term: str) -> float:
        df = len(self.postings.get(term, ()))
        n = len(self.docs)
        return math.log(1.0 + (n - df + 0.5) / (df + 0.5))

    def scores(self, query: str) -> dict[int, float]:
        out: dict[int, float] = {}
        for term in set(tokenize(query)):
            idf = self.idf(term)
            for i, tf in self.postings.get(term, ()):
                norm = self.k1 * (1.0 - self.b + self.b * self.lengths[i] / self.avgdl)
                out[i] = out.get(i, 0.0) + idf * tf * (self.k1 + 1.0) / (tf + norm)
        return out

    def search(self, query: str, topk: int) -> list[tuple[dict, float]]:
        ranked = sorted(self.scores(query).items(), key=lambda kv: (-kv[1], kv[0]))[:topk]
        return [(self.docs[i], s) for i, s in ranked]


@dataclass
class SearchToolConfig:
    corpus_path: str = ""
    topk: int = 3
    k1: float = 1.5
    b: float = 0.75
    max_doc_chars: int = 1000
    max_queries: int = 5


@register_tool("search")
class SearchTool(BaseTool):
    default_schema = {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Searches the knowledge corpus for relevant passages for each query.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query_list": {"type": "array", "items": {"type": "string"},
                                   "description": "A list of fully-formed search queries."},
                },
                "required": ["query_list"],
            },
        },
    }

    def __init__(self, config: dict | None = None, tool_schema=None):
        super().__init__(config, tool_schema)
        remote = sorted({"retrieval_service_url", "sandbox_fusion_url"} & set(self.config))
        if remote:
            raise ValueError(
                f"tool '{self.name}': {remote[0]} points at verl's remote retrieval server; hybridflow searches a "
                "local corpus with BM25: replace it with 'corpus_path: <jsonl of {\"id\", \"contents\"} rows>'"
            )
        self.settings = parse_tool_config(SearchToolConfig, self.config, self.name)
        if not self.settings.corpus_path:
            raise ValueError(
                f"tool '{self.name}' needs config.corpus_path: a local jsonl of {{\"id\", \"contents\"}} rows "
                "(hybridflow searches locally with BM25; verl's retrieval_service_url is not used)"
            )
        if self.settings.topk < 1:
            raise ValueError(f"tool '{self.name}': config.topk={self.settings.topk} must be >= 1")
        self.index = BM25Index.from_jsonl(self.settings.corpus_path, k1=self.settings.k1, b=self.settings.b)

    def format_hits(self, query: str, hits: list[tuple[dict, float]]) -> str:
        if not hits:
            return f"Query: {query}\n(no matching documents)"
        lines = [f"Query: {query}"]
        for rank, (doc, _score) in enumerate(hits, 1):
            text = doc["contents"]
            if len(text) > self.settings.max_doc_chars:
                text = text[: self.settings.max_doc_chars] + "..."
            lines.append(f"Doc {rank} (id={doc['id']}): {text}")
        return "\n".join(lines)

    async def execute(self, instance_id: str, parameters: dict, **kwargs) -> ExecuteResult:
        args, bad = self.check_arguments(parameters)
        if bad is not None:
            return bad
        queries = [q for q in args["query_list"] if q.strip()]
        if not queries:
            return error_result(f"{self.name}: query_list must contain at least one non-empty query")
        if len(queries) > self.settings.max_queries:
            return error_result(f"{self.name}: at most {self.settings.max_queries} queries per call, "
                                f"got {len(queries)}")
        blocks = [self.format_hits(q, self.index.search(q, self.settings.topk)) for q in queries]
        return ToolResponse(text="\n\n".join(blocks)), 0.0, {"num_queries": float(len(queries))}


__all__ = ["SearchTool", "SearchToolConfig", "BM25Index", "tokenize"]
