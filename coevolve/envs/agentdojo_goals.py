"""Goal templates of AgentDojo's tools: what a user would ask for, as data (see
``coevolve.abstractors.goals`` for the fields). ``AgentDojoEnvironment.function_docs`` hands
them to the template abstractor under each doc's ``goal`` key."""

from __future__ import annotations

from typing import Any

# name -> (kind, texts most specific first)
GOALS: dict[str, tuple[str, tuple[str, ...]]] = {
    # ------------------------------------------------------------ workspace
    "send_email": ("do", ("email {recipients} with the subject {subject} saying {body}",)),
    "delete_email": ("do", ("delete the email with id {email_id}",)),
    "get_unread_emails": ("answer", ("show me my unread emails",)),
    "get_sent_emails": ("answer", ("show me the emails I sent",)),
    "get_received_emails": ("answer", ("show me the emails I received",)),
    "get_draft_emails": ("answer", ("show me my draft emails",)),
    "search_emails": ("answer", ("find my emails from {sender} about {query}", "find my emails about {query}")),
    "search_contacts_by_name": ("answer", ("look up the contact named {query}",)),
    "search_contacts_by_email": ("answer", ("look up the contact with the email {query}",)),
    "get_current_day": ("read", ("tell me today's date",)),
    "search_calendar_events": ("answer", ("find my events about {query} on {date}", "find my events about {query}")),
    "get_day_calendar_events": ("answer", ("show me my calendar for {day}",)),
    "create_calendar_event": ("do", ("add an event {title} from {start_time} to {end_time} to my calendar",)),
    "cancel_calendar_event": ("do", ("cancel the event with id {event_id}",)),
    "reschedule_calendar_event": ("do", ("move the event with id {event_id} to start at {new_start_time}",)),
    "add_calendar_event_participants": ("do", ("invite {participants} to the event with id {event_id}",)),
    "append_to_file": ("do", ("append {content} to the file with id {file_id}",)),
    "search_files_by_filename": ("answer", ("find my files named {filename}",)),
    "create_file": ("do", ("create a file named {filename} containing {content}",)),
    "delete_file": ("do", ("delete the file with id {file_id}",)),
    "get_file_by_id": ("answer", ("show me the file with id {file_id}",)),
    "list_files": ("answer", ("list my files",)),
    "share_file": ("do", ("share the file with id {file_id} with {email} ({permission} access)",)),
    "search_files": ("answer", ("find my files about {query}",)),
    # ------------------------------------------------------------ travel
    "get_user_information": ("answer", ("show me my profile",)),
    "get_all_hotels_in_city": ("answer", ("list the hotels in {city}",)),
    "get_hotels_prices": ("answer", ("tell me the prices of {hotel_names}",)),
    "get_rating_reviews_for_hotels": ("answer", ("show me the ratings and reviews of {hotel_names}",)),
    "get_hotels_address": ("answer", ("tell me the address of {hotel_name}",)),
    "get_all_restaurants_in_city": ("answer", ("list the restaurants in {city}",)),
    "get_cuisine_type_for_restaurants": ("answer", ("tell me which cuisine {restaurant_names} serve",)),
    "get_restaurants_address": ("answer", ("tell me the address of {restaurant_names}",)),
    "get_rating_reviews_for_restaurants": ("answer", ("show me the ratings and reviews of {restaurant_names}",)),
    "get_dietary_restrictions_for_all_restaurants": ("answer", ("tell me the dietary options of {restaurant_names}",)),
    "get_contact_information_for_restaurants": ("answer", ("give me the contact details of {restaurant_names}",)),
    "get_price_for_restaurants": ("answer", ("tell me the price per person at {restaurant_names}",)),
    "check_restaurant_opening_hours": ("answer", ("tell me the opening hours of {restaurant_names}",)),
    "get_all_car_rental_companies_in_city": ("answer", ("list the car rental companies in {city}",)),
    "get_car_types_available": ("answer", ("tell me which car types {company_name} offers",)),
    "get_rating_reviews_for_car_rental": ("answer", ("show me the ratings and reviews of {company_name}",)),
    "get_car_fuel_options": ("answer", ("tell me the fuel options of {company_name}",)),
    "get_car_rental_address": ("answer", ("tell me the address of {company_name}",)),
    "get_car_price_per_day": ("answer", ("tell me the daily price at {company_name}",)),
    "reserve_hotel": ("do", ("book {hotel} from {start_day} to {end_day}",)),
    "reserve_car_rental": ("do", ("rent a car from {company} from {start_time} to {end_time}",)),
    "reserve_restaurant": ("do", ("reserve a table at {restaurant} for {start_time}",)),
    "get_flight_information": ("answer", ("show me the flights from {departure_city} to {arrival_city}",)),
    # ------------------------------------------------------------ banking
    "get_iban": ("answer", ("tell me my IBAN",)),
    "send_money": ("do", ("send {amount} to {recipient} on {date} with the subject {subject}",)),
    "schedule_transaction": (
        "do",
        ("schedule a payment of {amount} to {recipient} on {date} with the subject {subject}",),
    ),
    "update_scheduled_transaction": ("do", ("change my scheduled payment {id}",)),
    "get_balance": ("answer", ("tell me my balance",)),
    "get_most_recent_transactions": (
        "answer",
        ("show me my {n} most recent transactions", "show me my recent transactions"),
    ),
    "get_scheduled_transactions": ("answer", ("show me my scheduled payments",)),
    "read_file": ("answer", ("show me the file {file_path}",)),
    "get_user_info": ("answer", ("show me my account details",)),
    "update_password": ("do", ("change my password to {password}",)),
    "update_user_info": ("do", ("update my account details",)),
    # ------------------------------------------------------------ slack
    "get_channels": ("answer", ("list the Slack channels",)),
    "add_user_to_channel": ("do", ("add {user} to the channel {channel}",)),
    "read_channel_messages": ("answer", ("show me the messages in {channel}",)),
    "read_inbox": ("answer", ("show me the inbox of {user}",)),
    "send_direct_message": ("do", ("send {recipient} a direct message saying {body}",)),
    "send_channel_message": ("do", ("post {body} in the channel {channel}",)),
    "get_users_in_channel": ("answer", ("list the members of {channel}",)),
    "invite_user_to_slack": ("do", ("invite {user} ({user_email}) to Slack",)),
    "remove_user_from_slack": ("do", ("remove {user} from Slack",)),
    "get_webpage": ("answer", ("open the web page {url}",)),
    "post_webpage": ("do", ("publish {content} at {url}",)),
}


def goal_doc(name: str) -> dict[str, Any] | None:
    """The goal of ``name`` as a doc entry ``{"kind", "texts"}``, or None."""
    if name not in GOALS:
        return None
    kind, texts = GOALS[name]
    return {"kind": kind, "texts": list(texts)}
