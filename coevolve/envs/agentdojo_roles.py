"""Roles of AgentDojo's values where the generic rules of ``coevolve.roles`` need help.

Read off the four v1.2 suites' tool docs and default environments (environment knowledge,
never a user task's prompt or ground truth). ``AgentDojoEnvironment.value_roles`` returns
``TABLE``; ``AgentDojoEnvironment.state_data`` adds ``entities(env)`` under ``"@entities"``;
``AgentDojoEnvironment.result_data`` reads a result through ``result_view``.

Where names mislead or are too vague:

- a payment's ``recipient`` is an IBAN, and only one of the user's own records (a past or
  scheduled transaction's other party: never the bank's ``"me"`` placeholder, never the
  account's own IBAN); a Slack ``recipient`` is a Slack user; email recipients, ``cc``,
  ``participants`` and a file's ``email`` are addresses of the user's contacts and mail;
- ids exist: ``email_id``, ``event_id``, ``file_id`` (the cloud drive's ``files`` dict keys),
  a scheduled transaction's ``id``; only ``create_file`` names a new file and only
  ``invite_user_to_slack`` a new Slack user;
- dates have kinds: a day ``YYYY-MM-DD`` (a payment, a check-in; after the state's present),
  a calendar day (one with events, mostly), a datetime ``YYYY-MM-DD HH:MM`` and an end that
  follows its start; the state's own timestamps are no dates to act on;
- cities are per tool: hotels' cities for hotels, restaurants' for restaurants, flights'
  departure and arrival cities; hotels, restaurants and car rental companies are names the
  suite lists.

State keys that mean different things in different suites (``recipient``, ``sender``,
``name``, ``city``, ``date``, ``id``) are neutral; ``entities`` lists each role's values
under ``"@<role>"`` instead, and results get ``"function.key"`` entries.
"""

from __future__ import annotations

import datetime
import re
import weakref
from collections import Counter
from typing import Any

from coevolve.roles import ParamRole, RoleTable
from coevolve.values import GENERATORS, ValuePool

_URL = re.compile(r"(?:https?://)?www\.[\w.-]+\.[a-z]{2,}(?:/[\w./%-]*[\w/])?")
_DAY = r"\d{4}-\d{2}-\d{2}"
_DATETIME = r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}"
_IBAN = r"[A-Z]{2}\d{2}[A-Z0-9]{10,30}"
_DEFAULT_TODAY = datetime.date(2024, 5, 15)  # the workspace and travel calendars' current day


# ----------------------------------------------------------------------------- state entities
def present(env: dict[str, Any]) -> str | None:
    """A suite environment's today: the calendar's current day, else the latest past transaction."""
    day = (env.get("calendar") or {}).get("current_day")
    if day:
        return str(day)[:10]
    done = [str(t.get("date", ""))[:10] for t in (env.get("bank_account") or {}).get("transactions", [])]
    return max(done) if done else None


def _names(items: Any, key: str = "name") -> list[Any]:
    return [i[key] for i in items or [] if isinstance(i, dict) and i.get(key) not in (None, "")]


def entities(env: dict[str, Any]) -> dict[str, list[Any]]:
    """A suite environment's values by role, under ``"@<role>"`` (``TABLE.keys`` maps each back):
    the user's contacts and correspondents, the ids that exist, the counterparties of the
    user's own transactions, the suite's hotels and cities, the URLs the user's messages name."""
    out: dict[str, list[Any]] = {}

    def put(role: str, values: Any) -> None:
        bucket = out.setdefault(f"@{role}", [])
        for v in values:
            if v in (None, ""):
                continue
            if v in bucket:
                bucket.remove(v)
            bucket.append(v)

    # mail, calendar, drive: every address of the user's records, those the user writes to,
    # meets and shares with most last (a pool offers its newest values first: a colleague
    # before a stranger whose mail once arrived)
    inbox = env.get("inbox") or {}
    contacts = inbox.get("contact_list") or []
    emails = inbox.get("emails") or {}
    events = (env.get("calendar") or {}).get("events") or {}
    files = (env.get("cloud_drive") or {}).get("files") or {}
    own = inbox.get("account_email")
    outgoing: Counter[str] = Counter()
    incoming: Counter[str] = Counter(_names(contacts, "email"))
    for e in emails.values():
        incoming.update([e.get("sender")])
        (outgoing if e.get("sender") == own else incoming).update(
            [*(e.get("recipients") or []), *(e.get("cc") or []), *(e.get("bcc") or [])]
        )
    for ev in events.values():
        outgoing.update(ev.get("participants") or [])
    for f in files.values():
        outgoing.update(list(f.get("shared_with") or {}))
        incoming.update([f.get("owner")])

    def rank(address: Any) -> tuple[int, int, str]:
        return outgoing[address], incoming[address], str(address)

    put("email", [own] + sorted((a for a in {**incoming, **outgoing} if a and a != own), key=rank))
    ranked = sorted((c for c in contacts if c.get("email") != own), key=lambda c: rank(c.get("email")))
    put("contact_email", _names(ranked, "email"))
    put("contact_name", _names(ranked))
    put("email_id", list(emails))
    put("event_id", list(events))
    put("event_day", sorted({str(ev.get("start_time", ""))[:10] for ev in events.values()} - {""}))
    today = present(env)
    put("today", [today] if today else [])
    put("file_id", list(files))
    put("drive_file", [f.get("filename") for f in files.values()])
    # travel: what the suite lists, and the cities each kind of place is in
    hotels = (env.get("hotels") or {}).get("hotel_list")
    restaurants = (env.get("restaurants") or {}).get("restaurant_list")
    companies = (env.get("car_rental") or {}).get("company_list")
    flights = (env.get("flights") or {}).get("flight_list")
    put("hotel", _names(hotels))
    put("hotel_city", _names(hotels, "city"))
    put("restaurant", _names(restaurants))
    put("restaurant_city", _names(restaurants, "city"))
    put("car_company", _names(companies))
    put("car_rental_city", _names(companies, "city"))
    put("departure_city", _names(flights, "departure_city"))
    put("arrival_city", _names(flights, "arrival_city"))
    # banking: the other party of the user's own transactions
    bank = env.get("bank_account") or {}
    moves = (bank.get("transactions") or []) + (bank.get("scheduled_transactions") or [])
    parties = [p for t in moves for p in (t.get("recipient"), t.get("sender"))]
    put("iban", [p for p in parties if p not in ("me", bank.get("iban"))])
    put("scheduled_id", _names(bank.get("scheduled_transactions"), "id"))
    put("file_path", list((env.get("filesystem") or {}).get("files") or {}))
    # slack: its users and channels, and the web addresses its messages mention
    slack = env.get("slack") or {}
    put("slack_user", slack.get("users") or [])
    put("slack_channel", slack.get("channels") or [])
    boxes = [*(slack.get("user_inbox") or {}).values(), *(slack.get("channel_inbox") or {}).values()]
    put("url", [u for box in boxes for m in box for u in _URL.findall(str(m.get("body", "")))])
    put("url", (env.get("web") or {}).get("web_requests") or [])
    return {k: v for k, v in out.items() if v}


# ----------------------------------------------------------------------------- results
# A result that is a bare list or scalar (no key to read a role from), or a dict keyed by the
# names asked about: the role of its items, scalar or keys.
RESULT_ROLES: dict[str, str] = {
    "get_channels": "slack_channel",
    "get_users_in_channel": "slack_user",
    "get_iban": "own_iban",
    "get_current_day": "today",
    "get_balance": "balance",
    **dict.fromkeys(["get_hotels_prices", "get_rating_reviews_for_hotels", "get_hotels_address"], "hotel"),
    **dict.fromkeys(
        [
            "get_cuisine_type_for_restaurants",
            "get_restaurants_address",
            "get_rating_reviews_for_restaurants",
            "get_dietary_restrictions_for_all_restaurants",
            "get_contact_information_for_restaurants",
            "get_price_for_restaurants",
            "check_restaurant_opening_hours",
        ],
        "restaurant",
    ),
    **dict.fromkeys(
        [
            "get_car_types_available",
            "get_rating_reviews_for_car_rental",
            "get_car_fuel_options",
            "get_car_rental_address",
            "get_car_price_per_day",
        ],
        "car_company",
    ),
}

# The travel tools that list a city's places answer in text: "Hotel Names: A\nB\n"
_LISTINGS = [
    (re.compile(r"Hotel Names:(.*)", re.S), "hotel", None),
    (re.compile(r"Restaurant in (.+?):(.*)", re.S), "restaurant", "restaurant_city"),
    (re.compile(r"Car Rental Companies in (.+?):(.*)", re.S), "car_company", "car_rental_city"),
]


def listing_view(text: str) -> dict[str, list[str]] | None:
    """A travel listing's names under their role (``{"@hotel": [...]}``), or None for other text."""
    if not isinstance(text, str):
        return None
    for pattern, role, city_role in _LISTINGS:
        m = pattern.fullmatch(text.strip() + "\n")
        if m:
            names = [n.strip() for n in m.groups()[-1].splitlines() if n.strip()]
            view = {f"@{role}": names}
            if city_role:
                view[f"@{city_role}"] = [m.group(1).strip()]
            return view
    return None


def _drop_me(data: Any) -> Any:
    """``data`` without the bank's ``"me"`` placeholder party (the account's own side: no IBAN)."""
    if isinstance(data, dict):
        return {k: _drop_me(v) for k, v in data.items() if not (k in ("sender", "recipient") and v == "me")}
    if isinstance(data, list):
        return [_drop_me(v) for v in data]
    return data


def result_view(data: Any, function: str = "") -> Any:
    """A parsed result as harvesting reads it: the bank's ``"me"`` dropped, and, where
    ``function`` is given, a bare result or a name-keyed dict under the role ``RESULT_ROLES``
    gives it (``get_channels`` -> ``{"@slack_channel": [...]}``)."""
    data = _drop_me(data)
    role = RESULT_ROLES.get(function)
    if role is None or data is None:
        return data
    if isinstance(data, dict):
        return {f"@{role}": list(data), "result": data}
    return {f"@{role}": data}


# ----------------------------------------------------------------------------- generators
_STARTS: weakref.WeakKeyDictionary[ValuePool, dict[str, datetime.datetime]] = weakref.WeakKeyDictionary()
_STOP = {"your", "with", "from", "about", "next", "just", "this", "that", "have", "will", "docx", "xlsx", "pptx"}
_KEYWORDS = ["meeting", "project", "report", "budget", "schedule"]


def _today(pool: ValuePool) -> datetime.date:
    days = []
    for v in pool.by_role.get("today", []):
        try:
            days.append(datetime.date.fromisoformat(str(v)[:10]))
        except ValueError:
            continue
    return max(days) if days else _DEFAULT_TODAY


def _start(pool: ValuePool, kind: str, when: datetime.datetime) -> None:
    _STARTS.setdefault(pool, {})[kind] = when


def _future_day(p: ParamRole, pool: ValuePool, rng: Any) -> str:
    day = _today(pool) + datetime.timedelta(days=rng.randint(1, 45))
    _start(pool, "day", datetime.datetime.combine(day, datetime.time()))
    return day.isoformat()


def _end_day(p: ParamRole, pool: ValuePool, rng: Any) -> str:
    start = _STARTS.get(pool, {}).get("day")
    if start is None:
        return _future_day(p, pool, rng)
    return (start.date() + datetime.timedelta(days=rng.randint(1, 6))).isoformat()


def _future_datetime(p: ParamRole, pool: ValuePool, rng: Any) -> str:
    day = _today(pool) + datetime.timedelta(days=rng.randint(1, 30))
    when = datetime.datetime.combine(day, datetime.time(rng.choice([9, 10, 11, 12, 13, 14, 15, 16, 18, 19])))
    when += datetime.timedelta(minutes=rng.choice([0, 30]))
    _start(pool, "datetime", when)
    return when.strftime("%Y-%m-%d %H:%M")


def _end_datetime(p: ParamRole, pool: ValuePool, rng: Any) -> str:
    """An end after the start just made: an hour or two later; a rental's a few days later."""
    start = _STARTS.get(pool, {}).get("datetime")
    if start is None:
        return _future_datetime(p, pool, rng)
    if "reservation" in p.description.lower():
        end = start + datetime.timedelta(days=rng.randint(1, 5))
    else:
        end = start + datetime.timedelta(minutes=rng.choice([30, 60, 90, 120]))
    return end.strftime("%Y-%m-%d %H:%M")


def _calendar_day(p: ParamRole, pool: ValuePool, rng: Any) -> str:
    """Mostly a day the calendar has events on, else a day ahead."""
    days = sorted({str(v)[:10] for v in pool.by_role.get("event_day", []) if re.match(_DAY, str(v))})
    if days and rng.random() < 0.8:
        return rng.choice(days)
    return (_today(pool) + datetime.timedelta(days=rng.randint(0, 20))).isoformat()


def _topic(source: str) -> Any:
    """A search word taken from the titles of ``source`` (email subjects, event titles, file
    names), so that the search finds something; a common word where none is known."""

    def gen(p: ParamRole, pool: ValuePool, rng: Any) -> str:
        words = sorted(
            {
                w.lower()
                for v in pool.by_role.get(source, [])
                for w in re.split(r"[^A-Za-z]+", str(v))
                if len(w) >= 4 and w.lower() not in _STOP
            }
        )
        return rng.choice(words) if words else rng.choice(_KEYWORDS)

    return gen


def _attachment(p: ParamRole, pool: ValuePool, rng: Any) -> dict[str, str] | None:
    files = [f for f in pool.by_role.get("file_id", []) if isinstance(f, str)]
    return {"type": "file", "file_id": rng.choice(files)} if files else None


for _name, _gen in {
    "agentdojo_day": _future_day,
    "agentdojo_end_day": _end_day,
    "agentdojo_datetime": _future_datetime,
    "agentdojo_end_datetime": _end_datetime,
    "agentdojo_calendar_day": _calendar_day,
    "agentdojo_email_topic": _topic("subject"),
    "agentdojo_event_topic": _topic("event_title"),
    "agentdojo_file_topic": _topic("drive_file"),
    "agentdojo_attachment": _attachment,
}.items():
    GENERATORS.setdefault(_name, _gen)


# ----------------------------------------------------------------------------- the table
# mail results: the other side of a mail is its sender when it came in, its recipients when
# it went out (the user's own address is no one to write to)
_INCOMING = ["get_unread_emails", "get_received_emails"]
_OUTGOING = ["send_email", "get_sent_emails", "get_draft_emails"]
_EMAIL_RESULTS = [*_INCOMING, *_OUTGOING, "search_emails"]
_EVENT_RESULTS = ["search_calendar_events", "get_day_calendar_events", "create_calendar_event",
                  "reschedule_calendar_event", "add_calendar_event_participants"]  # fmt: skip
_FILE_RESULTS = ["search_files_by_filename", "create_file", "get_file_by_id", "list_files", "share_file",
                 "append_to_file", "search_files"]  # fmt: skip
# the roles ``entities`` and ``result_view`` list under "@<role>"
_LISTED = [
    *("email", "contact_email", "contact_name", "email_id", "event_id", "event_day", "today", "file_id"),
    *("drive_file", "hotel", "hotel_city", "restaurant", "restaurant_city", "car_company", "car_rental_city"),
    *("departure_city", "arrival_city", "iban", "own_iban", "balance", "scheduled_id", "file_path"),
    *("slack_user", "slack_channel", "url"),
]  # fmt: skip

TABLE = RoleTable(
    params={
        # ------------------------------------------------ mail, contacts (workspace, travel)
        "recipients": "email",
        "cc": "email",
        "bcc": "email",
        "participants": "email",
        "attachments": "attachment",
        "send_email.subject": "email_subject",
        "send_email.body": "text",
        "email_id": "email_id",
        "search_emails.query": "email_query",
        "search_emails.sender": "email",
        "search_contacts_by_name.query": "contact_name",
        "search_contacts_by_email.query": "contact_email",
        "share_file.email": "email",
        # ------------------------------------------------ calendar
        "event_id": "event_id",
        "search_calendar_events.query": "event_query",
        "search_calendar_events.date": "calendar_day",
        "get_day_calendar_events.day": "calendar_day",
        "create_calendar_event.title": "new_event_title",
        "create_calendar_event.start_time": "datetime",
        "create_calendar_event.end_time": "end_datetime",
        "create_calendar_event.description": "text",
        "new_start_time": "datetime",
        "new_end_time": "end_datetime",
        "location": "location",
        # ------------------------------------------------ cloud drive
        "file_id": "file_id",
        "filename": "drive_file",
        "search_files.query": "file_query",
        "append_to_file.content": "text",
        "create_file.content": "text",
        # ------------------------------------------------ travel
        "get_all_hotels_in_city.city": "hotel_city",
        "get_all_restaurants_in_city.city": "restaurant_city",
        "get_all_car_rental_companies_in_city.city": "car_rental_city",
        "departure_city": "departure_city",
        "arrival_city": "arrival_city",
        "hotel_names": "hotel",
        "hotel_name": "hotel",
        "hotel": "hotel",
        "restaurant_names": "restaurant",
        "restaurant": "restaurant",
        "company_name": "car_company",
        "company": "car_company",
        "start_day": "day",
        "end_day": "end_day",
        "reserve_car_rental.start_time": "datetime",
        "reserve_car_rental.end_time": "end_datetime",
        "reserve_restaurant.start_time": "datetime",
        # ------------------------------------------------ banking
        "send_money.recipient": "iban",
        "schedule_transaction.recipient": "iban",
        "update_scheduled_transaction.recipient": "iban",
        "amount": "money",
        "send_money.subject": "payment_subject",
        "schedule_transaction.subject": "payment_subject",
        "update_scheduled_transaction.subject": "payment_subject",
        "send_money.date": "day",
        "schedule_transaction.date": "day",
        "update_scheduled_transaction.date": "day",
        "update_scheduled_transaction.id": "scheduled_id",
        "get_most_recent_transactions.n": "transaction_count",
        "file_path": "file_path",
        "update_password.password": "new_password",
        "update_user_info.first_name": "first_name",
        "update_user_info.last_name": "last_name",
        "update_user_info.street": "street",
        "update_user_info.city": "home_city",
        # ------------------------------------------------ slack, web
        "user": "slack_user",
        "channel": "slack_channel",
        "send_direct_message.recipient": "slack_user",
        "send_direct_message.body": "text",
        "send_channel_message.body": "text",
        "user_email": "email",
        "url": "url",
        "post_webpage.content": "text",
    },
    keys={
        **{f"@{role}": role for role in _LISTED},
        # unambiguous keys of the suites' states and results
        "email": "email",
        "account_email": "email",
        "owner": "email",
        "Email": "email",
        "recipients": "email",
        "cc": "email",
        "bcc": "email",
        "participants": "email",
        "filename": "drive_file",
        "location": "location",
        "subject": "subject",
        "title": "event_title",
        "start_time": "event_time",
        "end_time": "event_time",
        "current_day": "today",
        "amount": "money",
        "balance": "balance",
        "iban": "own_iban",
        "users": "slack_user",
        "channels": "slack_channel",
        "web_requests": "url",
        "departure_city": "departure_city",
        "arrival_city": "arrival_city",
        # keys that mean different things per suite, or records no call should repeat: neutral
        # (their values of a role come from ``entities`` and the "function.key" entries below)
        **dict.fromkeys(["recipient", "sender"], "party"),
        "name": "record_name",
        "city": "record_city",
        "date": "record_day",
        "id": "transaction_id",
        "id_": "record_id",
        **dict.fromkeys(["body", "content", "description", "message", "reviews"], "record_text"),
        **dict.fromkeys(["timestamp", "last_modified", "departure_time", "arrival_time"], "record_time"),
        **dict.fromkeys(["first_name", "last_name", "street"], "own_profile"),
        "password": "old_password",
        # results, per function
        **{f"{f}.id_": "email_id" for f in _EMAIL_RESULTS},
        **{f"{f}.{k}": "email" for f in [*_INCOMING, "search_emails"] for k in ("sender",)},
        **{f"{f}.{k}": "party" for f in _INCOMING for k in ("recipients", "cc", "bcc")},
        **{f"{f}.sender": "party" for f in _OUTGOING},
        **{f"{f}.owner": "party" for f in _FILE_RESULTS},
        **{f"{f}.id_": "event_id" for f in _EVENT_RESULTS},
        **{f"{f}.id_": "file_id" for f in _FILE_RESULTS},
        "delete_file.id_": "deleted_file_id",
        "delete_file.filename": "deleted_file",
        "search_contacts_by_name.name": "contact_name",
        "search_contacts_by_email.name": "contact_name",
        "get_most_recent_transactions.recipient": "iban",
        "get_scheduled_transactions.recipient": "iban",
        "get_scheduled_transactions.id": "scheduled_id",
        "read_inbox.sender": "slack_user",
        "read_inbox.recipient": "slack_user",
        "read_channel_messages.sender": "slack_user",
        "read_channel_messages.recipient": "slack_channel",
    },
    dict_keys={
        "emails": ("email_id", ""),
        "trash": ("trashed_email_id", ""),
        "events": ("event_id", ""),
        "files": ("file_id", ""),  # the cloud drive's (banking's filesystem keys are paths: see entities)
        "shared_with": ("email", "permission"),
        "user_inbox": ("slack_user", ""),
        "user_channels": ("slack_user", ""),
        "channel_inbox": ("slack_channel", ""),
        "web_content": ("web_page", ""),  # the open web, not the user's records
    },
    creatable={
        "text": "text",
        "email_subject": (
            "choice:Quick question|Notes from today|Follow-up on our call|Lunch on Friday?|Updated schedule"
            "|Project status|Weekend plans|Thank you"
        ),
        "new_event_title": (
            "choice:Team lunch|Dentist appointment|Project kickoff|Quarterly planning|Gym session|Book club"
            "|Client call|Coffee catch-up"
        ),
        "location": "choice:Conference Room A|Main Office|Central Park Cafe|Online|The Local Bar|Library",
        "email_query": "agentdojo_email_topic",
        "event_query": "agentdojo_event_topic",
        "file_query": "agentdojo_file_topic",
        "attachment": "agentdojo_attachment",
        "drive_file": "file_name",
        "calendar_day": "agentdojo_calendar_day",
        "day": "agentdojo_day",
        "end_day": "agentdojo_end_day",
        "datetime": "agentdojo_datetime",
        "end_datetime": "agentdojo_end_datetime",
        "money": "money",
        "payment_subject": (
            "choice:Rent|Dinner|Birthday gift|Utilities|Concert tickets|Groceries|Phone bill|Gym membership|Car repair"
        ),
        "transaction_count": "range:1:10",
        "new_password": "password",
        "first_name": "person_name",
        "last_name": "choice:Smith|Garcia|Miller|Brown|Davis|Wilson",
        "street": "choice:Main Street 12|Oak Avenue 5|Lake Road 27|Elm Street 9|Park Lane 3",
        "home_city": "choice:San Francisco|Seattle|Austin|Boston|Denver|Chicago",
        "slack_user": "person_name",
    },
    compatible={"payment_subject": ("subject",)},
    formats={
        "email": r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+",
        "contact_email": r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+",
        "iban": _IBAN,
        "own_iban": _IBAN,
        "day": _DAY,
        "end_day": _DAY,
        "calendar_day": _DAY,
        "event_day": _DAY,
        "today": _DAY,
        "datetime": _DATETIME,
        "end_datetime": _DATETIME,
        "email_id": r"\d+",
        "event_id": r"\d+",
        "file_id": r"\d+",
        "url": _URL.pattern,
    },
    new=frozenset({"create_file.filename", "invite_user_to_slack.user"}),
    existing=frozenset({"drive_file", "slack_user"}),
)
